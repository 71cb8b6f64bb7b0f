"""``python -m durafn``: the same as the ``durafn`` command."""

from .cli import main

main()
