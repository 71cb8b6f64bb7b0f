"""SQLite: the driver (``driver``), its statements as one call each on aiosqlite's
thread (``calls``), and its one-call finishes (``batches``)."""
