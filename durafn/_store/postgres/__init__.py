"""PostgreSQL: the driver (``driver``: NOTIFY, connection health, time limits), its
array-bound multi-row statements (``multirow``), the process's LISTEN connections
(``listener``) and what a URL says about a pooler in between (``pooling``). Imported only
for a PostgreSQL URL."""
