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
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
