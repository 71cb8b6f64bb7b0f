"""An app module that fails while it is imported (``durafn --app tests.apps.broken_app:app``
must say that the import failed, and where)."""

import durafn

app = durafn.App("sqlite+aiosqlite:///never-opened.db")
raise RuntimeError("the app's configuration is missing")
