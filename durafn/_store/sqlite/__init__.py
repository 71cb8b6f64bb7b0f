"""SQLite: the driver (``driver``), its statements as one call each on aiosqlite's
thread (``calls``), the file's turn its writers wait in line for (``turns``), its
one-call finishes (``multirow``), its SQL for the shared elements (``sql``) and its
release trigger (``triggers``)."""
