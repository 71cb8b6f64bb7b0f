"""The shop's settings: one database, Django's and durafn's (its tables beside the shop's).

``SHOP_DATABASE_URL`` names it as a SQLAlchemy URL (``sqlite:///shop.sqlite3``, the
default, or ``postgresql://user@host/dbname``); ``shop.tasks`` gives durafn the same
database through ``durafn.django.database_url()``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "an example's key: set your own"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shop_project.urls"
MIDDLEWARE: list[str] = []
INSTALLED_APPS = ["durafn.django", "shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The confirmation emails, one file each (the worker sends them; Django's backend).
EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
EMAIL_FILE_PATH = os.environ.get("SHOP_MAIL_DIR", str(BASE_DIR / "sent-mail"))


def _database(url: str) -> dict[str, Any]:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": parsed.database,
            # Writers begin IMMEDIATE (no deferred upgrade to fail on a busy file), and
            # wait up to 30 s for a durafn worker's write to end.
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    return {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
    }


DATABASES = {
    "default": _database(
        os.environ.get("SHOP_DATABASE_URL", f"sqlite:///{BASE_DIR / 'shop.sqlite3'}")
    )
}
