"""PostgreSQL: the driver (``driver``: LISTEN/NOTIFY, connection health) and its
array-bound batch statements (``batches``). Imported only for a PostgreSQL URL."""
