#!/usr/bin/env python
"""Django's command line with odal's settings (the same as the `odal` console script)."""

from odal.__main__ import main

if __name__ == "__main__":
    main()
