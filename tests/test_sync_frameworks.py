"""Django's and Flask's routes into ``app.sync``, through the examples, on both engines:
an order and its confirmation's row commit together in the framework's transaction
(Django's ``transaction.atomic()``, Flask-SQLAlchemy's ``db.session``); a view that fails
after scheduling writes neither; a worker then sends the confirmation (Django: a worker
process, ``manage.py durafn worker``). On PostgreSQL the NOTIFY is in the transaction:
heard for the committed order only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy.engine import make_url

from examples import flask_app

from .support.helpers import CEILING
from .support.processes import owned_sync, tagged

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def plain(db_url: str) -> str:
    """The test database's URL without a driver: the frameworks choose theirs."""
    url = make_url(db_url)
    return url.set(drivername=url.get_backend_name()).render_as_string(hide_password=False)


def test_the_django_shop(db_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")}
    env["SHOP_MAIL_DIR"] = str(tmp_path / "mail")
    with owned_sync() as token:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "django_shop" / "run.py"), plain(db_url)],
            env=tagged(token, env),
            capture_output=True,
            text=True,
            timeout=CEILING,
        )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout[done.stdout.index("{") :])
    assert out["worker_exit"] == 0, out["worker_stderr"]
    assert (out["placed"], out["declined"]) == (201, 500)
    assert out["orders"] == ["ann@example.com"]  # the declined order rolled back ...
    assert out["rows_before_worker"] == [["shop:send_confirmation", "Pending"]]  # ... its row too
    assert out["confirmation"] == ["Success", "ann@example.com"]
    assert out["shown"] == {"order": 1, "confirmed": True}
    assert out["mails"] == 1
    postgres = db_url.startswith("postgresql")
    assert out["notified"] == (["action", "marker"] if postgres else None)


def test_the_flask_shop(db_url: str) -> None:
    out = flask_app.run(plain(db_url))
    assert (out["placed"], out["declined"]) == (201, 500)
    assert out["orders"] == ["ann@example.com"]
    assert out["rows_before_worker"] == [["flask_shop:send_confirmation", "Pending"]]
    assert out["ran"] == 1
    assert out["confirmation"] == ["Success", "ann@example.com"]
    assert out["shown"] == {"order": 1, "confirmed": True}
