"""The system tables as they are (``tables``, ``SCHEMA_VERSION``) and the steps from each
earlier version (``migrations``)."""
