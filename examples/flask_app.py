"""durafn in a Flask app on Flask-SQLAlchemy: a view creates an order and schedules its
confirmation in the request's transaction (``db.session``), which Flask-SQLAlchemy's
convention commits in the view (``db.session.commit()``) and rolls back at the end of a
request that did not (an error, a 500).

    POST /orders {"email": "ann@example.com", "item": "tea"}  -> 201 {"order": 1, ...}
    POST /orders {... "decline": true}                        -> 500, and nothing written
    GET  /orders/1                                            -> {"order": 1, "confirmed": ...}

``python examples/flask_app.py [URL]`` runs it end to end with Flask's test client and an
executor (a temporary SQLite file unless a URL is given: ``sqlite:///shop.db``,
``postgresql://user@host/dbname``). For real: ``flask --app examples.flask_app run``, and
the worker ``durafn worker --app examples.flask_app:tasks`` (``SHOP_DATABASE_URL`` for both).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from typing import Any

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import durafn
from durafn import ActionCtx


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "flask_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))
    item: Mapped[str] = mapped_column(String(100))
    confirmed_at: Mapped[datetime | None]


def urls(url: str) -> tuple[str, str]:
    """One database, as Flask-SQLAlchemy (a sync driver) and durafn (an async one) reach it."""
    parsed = make_url(url)
    sqlite = parsed.get_backend_name() == "sqlite"
    sync = parsed.set(drivername="sqlite+pysqlite" if sqlite else "postgresql+psycopg")
    durable = parsed.set(drivername="sqlite+aiosqlite" if sqlite else "postgresql+asyncpg")
    return (
        sync.render_as_string(hide_password=False),
        durable.render_as_string(hide_password=False),
    )


DATABASE = os.environ.get("SHOP_DATABASE_URL", "sqlite:///flask_shop.sqlite3")
tasks = durafn.App(urls(DATABASE)[1])


def create_app(url: str = DATABASE) -> Flask:
    web = Flask(__name__)
    sync_url = urls(url)[0]
    web.config["SQLALCHEMY_DATABASE_URI"] = sync_url
    if sync_url.startswith("sqlite"):  # wait for a worker's write rather than fail at once
        web.config["SQLALCHEMY_ENGINE_OPTIONS"] = {"connect_args": {"timeout": 30}}
    db.init_app(web)

    @web.post("/orders")
    def create_order() -> ResponseReturnValue:
        data = request.get_json()
        order = Order(email=str(data["email"]), item=str(data["item"]))
        db.session.add(order)
        db.session.flush()  # the order's id, for the confirmation
        sid = tasks.sync.scheduler(db.session).run_after(0, send_confirmation, order.id)
        if data.get("decline"):  # a failure after scheduling: both roll back
            raise ValueError("payment declined")
        db.session.commit()  # the order and its confirmation's row, together
        return jsonify(order=order.id, confirmation=sid), 201

    @web.get("/orders/<int:order_id>")
    def show_order(order_id: int) -> ResponseReturnValue:
        order = db.session.get(Order, order_id)
        if order is None:
            return jsonify(error="no such order"), 404
        return jsonify(order=order.id, confirmed=order.confirmed_at is not None)

    return web


web_for_worker: Flask | None = None


@tasks.action(name="flask_shop:send_confirmation")
def send_confirmation(ctx: ActionCtx, order_id: int) -> str:
    """A plain ``def``, in a worker thread, inside an application context of its own."""
    global web_for_worker
    web_for_worker = web_for_worker or create_app(os.environ.get("SHOP_DATABASE_URL", DATABASE))
    with web_for_worker.app_context():
        order = db.session.get(Order, order_id)
        if order is None:
            return "no such order"
        order.confirmed_at = datetime.now(UTC)  # (and the email sent here)
        db.session.commit()
        return order.email


def run(url: str) -> dict[str, Any]:
    """The app end to end on ``url``: two orders, then an executor runs what is due."""
    global tasks, web_for_worker
    os.environ["SHOP_DATABASE_URL"] = url
    tasks = tasks.using(urls(url)[1])
    web = web_for_worker = create_app(url)
    web.logger.disabled = True  # (the declined order's 500 is meant)
    with web.app_context():
        db.create_all()
    tasks.sync.migrate()  # durafn's tables, beside the shop's
    client = web.test_client()
    placed = client.post("/orders", json={"email": "ann@example.com", "item": "tea"})
    declined = client.post("/orders", json={"email": "bob@example.com", "item": "x", "decline": 1})
    before = [[row.name, row.state.value] for row in tasks.sync.list().items]

    async def work() -> int:
        try:
            return await tasks.executor().run_until_idle()
        finally:
            await tasks.aclose()

    ran = asyncio.run(work())
    assert placed.json is not None
    row = tasks.sync.get(placed.json["confirmation"])
    tasks.sync.close()
    with web.app_context():
        orders = sorted(o.email for o in db.session.scalars(db.select(Order)))
        db.engine.dispose()
    return {
        "placed": placed.status_code,
        "declined": declined.status_code,
        "orders": orders,
        "rows_before_worker": before,
        "ran": ran,
        "confirmation": None if row is None else [row.state.value, row.result],
        "shown": client.get(f"/orders/{placed.json['order']}").json,
    }


if __name__ == "__main__":
    default = f"sqlite:///{tempfile.mkdtemp()}/shop.sqlite3"
    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else default), indent=2))
