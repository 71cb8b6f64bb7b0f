"""Writing rows and their ends: keyed and debounced inserts (``keys``, ``debounce``), a
run's finish (``finish``), its failures and retries (``failures``), cancels
(``cancels``), and the completion callbacks a finish or a cancel schedules
(``completions``). Plain inserts are each dialect's own (``sqlite``, ``postgres``)."""
