"""The `odal` console script: Django's command line with odal's settings."""

import importlib
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "odal.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:  # the settings read the environment: a bad or missing variable is its sentence, not a traceback
        importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"])
    except ImproperlyConfigured as exc:
        sys.exit(f"odal cannot start: {exc}")
    from odal import reconnect

    try:
        execute_from_command_line(sys.argv)
    except reconnect.ERRORS as exc:  # a database that is down or went: its sentence, exit 4
        if not reconnect.is_lost(exc):
            raise
        print(f"odal: {reconnect.unanswered(exc)}", file=sys.stderr)
        sys.exit(DATABASE_UNANSWERED)


DATABASE_UNANSWERED = 4  # the exit code of a command whose database does not answer: safe to retry


if __name__ == "__main__":
    main()
