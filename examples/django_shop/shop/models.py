from __future__ import annotations

from django.db import models


class Order(models.Model):
    email = models.EmailField()
    item = models.CharField(max_length=100)
    confirmation_sent_at = models.DateTimeField(null=True)
