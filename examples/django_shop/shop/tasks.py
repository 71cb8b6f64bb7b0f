"""The shop's durable functions. ``durafn.django.database_url()``: durafn's tables are in
Django's database, so a view's rows commit in its ``transaction.atomic()``.

Run them with ``python manage.py durafn worker --app shop.tasks:app``."""

from __future__ import annotations

from django.core.mail import send_mail
from django.db import close_old_connections
from django.utils import timezone

from durafn import ActionCtx, App
from durafn.django import database_url

from .models import Order

app = App(database_url())


@app.action(name="shop:send_confirmation")
def send_confirmation(ctx: ActionCtx, order_id: int) -> str:
    """A plain ``def``: it runs in a worker thread, where Django's ORM may be used."""
    close_old_connections()  # Django's rule for work outside a request
    try:
        order = Order.objects.get(pk=order_id)
        send_mail(
            f"Your order #{order.id}",
            f"We have your order of {order.item}.",
            "shop@example.com",
            [order.email],
        )
        Order.objects.filter(pk=order_id).update(confirmation_sent_at=timezone.now())
        return order.email
    finally:
        close_old_connections()
