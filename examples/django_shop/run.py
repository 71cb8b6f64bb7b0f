"""The Django shop end to end, on the database a URL names (SQLite file, or an empty
PostgreSQL database): Django's and durafn's migrations, two orders through Django's test
client (one committed, one declined after scheduling), then a worker as a process
(``manage.py durafn worker --exit-on-complete``). Prints what happened as JSON.

    python examples/django_shop/run.py sqlite:////tmp/shop.sqlite3
    python examples/django_shop/run.py postgresql://postgres@127.0.0.1/shop

On PostgreSQL it also LISTENs to durafn's channel: the committed order's NOTIFY arrives,
the declined one's never does (it was in the rolled-back transaction).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ONCE = ["--exit-on-complete"]  # run what is due, then exit


def main(url: str) -> dict[str, Any]:
    os.environ["SHOP_DATABASE_URL"] = url
    os.environ.setdefault("SHOP_MAIL_DIR", tempfile.mkdtemp(prefix="shop-mail-"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "shop_project.settings"
    sys.path.insert(0, str(HERE))
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client
    from shop.models import Order
    from shop.tasks import app

    call_command("migrate", verbosity=0)
    call_command("durafn", "migrate", "--app", "shop.tasks:app")
    listener = _listen(url)
    client = Client(raise_request_exception=False)
    placed = client.post(
        "/orders", {"email": "ann@example.com", "item": "tea"}, content_type="application/json"
    )
    declined = client.post(
        "/orders",
        {"email": "bob@example.com", "item": "cake", "decline": True},
        content_type="application/json",
    )
    notified = _heard(listener)
    before = [(row.name, row.state.value) for row in app.sync.list().items]
    worker = subprocess.run(
        [sys.executable, "manage.py", "durafn", "worker", "--app", "shop.tasks:app", *ONCE],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    order = placed.json()["order"]
    row = app.sync.get(placed.json()["confirmation"])
    app.sync.close()
    return {
        "placed": placed.status_code,
        "declined": declined.status_code,
        "orders": sorted(Order.objects.values_list("email", flat=True)),
        "rows_before_worker": before,
        "worker_exit": worker.returncode,
        "worker_stderr": worker.stderr[-2000:],
        "confirmation": None if row is None else [row.state.value, row.result],
        "shown": client.get(f"/orders/{order}").json(),
        "mails": len(os.listdir(os.environ["SHOP_MAIL_DIR"])),
        "notified": notified,
    }


def _listen(url: str) -> Any:
    """On PostgreSQL, a connection LISTENing to durafn's wake-ups (None on SQLite)."""
    if not url.startswith("postgresql"):
        return None
    import psycopg

    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    conn.execute("LISTEN durafn_wakeup")
    return conn


def _heard(conn: Any) -> list[str] | None:
    """The payloads heard, up to a marker sent after both requests (in commit order)."""
    if conn is None:
        return None
    with conn:
        conn.execute("SELECT pg_notify('durafn_wakeup', 'marker')")
        heard = []
        for notice in conn.notifies(timeout=300):
            heard.append(notice.payload)
            if notice.payload == "marker":
                break
        return heard


if __name__ == "__main__":
    default = f"sqlite:///{tempfile.mkdtemp()}/shop.sqlite3"
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else default), indent=2))
