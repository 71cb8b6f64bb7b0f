"""``python manage.py durafn ARGS``: the ``durafn`` command, inside the Django project
(settings loaded, apps ready), so that ``durafn worker --app shop.tasks:app`` runs
functions that use the ORM, and ``durafn migrate`` creates durafn's tables in Django's
database."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the durafn command (worker, migrate, ls, ...) inside this Django project."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, help="the durafn command's arguments")

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything after `durafn` is durafn's (its own --help and options included).
        from durafn.cli import main

        main.main(args=argv[2:], prog_name=f"{argv[0]} durafn")

    def handle(self, *args: str, **options: Any) -> None:  # call_command's route
        from durafn.cli import main

        try:
            main.main(args=list(args), prog_name="durafn", standalone_mode=False)
        except SystemExit as exit:
            if exit.code:
                sys.exit(exit.code)
