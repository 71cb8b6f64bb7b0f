from __future__ import annotations

import json

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from .models import Order
from .tasks import app, send_confirmation


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    """The order and its confirmation email commit together, or neither does: the row
    that sends the email is written in the view's transaction (no on_commit to lose)."""
    data = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(email=data["email"], item=data["item"])
        sid = app.sync.scheduler(connection).run_after(0, send_confirmation, order.id)
        if data.get("decline"):  # a failure after scheduling: both roll back
            raise ValueError("payment declined")
    return JsonResponse({"order": order.id, "confirmation": sid}, status=201)


@require_GET
def show_order(request: HttpRequest, order_id: int) -> HttpResponse:
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return JsonResponse({"error": "no such order"}, status=404)
    sent = order.confirmation_sent_at
    return JsonResponse({"order": order.id, "confirmed": sent is not None})
