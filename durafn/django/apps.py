"""The Django app ``durafn.django``: its ``durafn`` management command."""

from __future__ import annotations

from django.apps import AppConfig


class DurafnConfig(AppConfig):
    name = "durafn.django"
    label = "durafn"
    verbose_name = "durafn"
