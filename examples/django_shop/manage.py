#!/usr/bin/env python
"""The shop's Django command line: ``python manage.py migrate``, ``runserver``, and
``python manage.py durafn worker --app shop.tasks:app`` (durafn's command, inside the
project: ``durafn.django``)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
