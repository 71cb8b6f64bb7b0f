"""durafn in a Django project: its tables in Django's database, its rows written in
Django's transactions.

* ``database_url(alias)``: the URL of Django's database ``alias`` as durafn takes it, so
  that the app, its workers and Django share one database:
  ``app = durafn.App(database_url())``;
* ``app.sync.scheduler(django.db.connection)``: inside ``transaction.atomic()``, rows
  written in Django's transaction, the workers woken by a ``transaction.on_commit``
  (``durafn._sync_targets``);
* ``"durafn.django"`` in ``INSTALLED_APPS``: ``python manage.py durafn ...`` runs the
  ``durafn`` command inside the project, Django set up (``durafn migrate``, ``durafn
  worker --app shop.tasks:app``), so that the functions may use the ORM.

Django is imported when these are used, never by ``import durafn``.
"""

from __future__ import annotations

from sqlalchemy.engine import URL

from .._errors import ArgumentError

__all__ = ["database_url"]

_DRIVERS = {
    "django.db.backends.postgresql": "postgresql+asyncpg",
    "django.db.backends.sqlite3": "sqlite+aiosqlite",
}


def database_url(alias: str = "default") -> str:
    """The SQLAlchemy URL of Django's database ``alias`` (``settings.DATABASES``), with
    durafn's async driver: asyncpg for PostgreSQL, aiosqlite for SQLite (its file)."""
    from django.conf import settings

    try:
        database = settings.DATABASES[alias]
    except KeyError:
        raise ArgumentError(f"settings.DATABASES has no database {alias!r}") from None
    engine = str(database.get("ENGINE", ""))
    driver = _DRIVERS.get(engine)
    if driver is None:
        raise ArgumentError(
            f"durafn runs on PostgreSQL and SQLite; settings.DATABASES[{alias!r}] is {engine}"
        )
    if driver.startswith("sqlite"):
        return URL.create(driver, database=str(database["NAME"])).render_as_string()
    port = database.get("PORT")
    url = URL.create(
        driver,
        username=database.get("USER") or None,
        password=database.get("PASSWORD") or None,
        host=database.get("HOST") or None,
        port=int(port) if port else None,
        database=database.get("NAME") or None,
    )
    return url.render_as_string(hide_password=False)
