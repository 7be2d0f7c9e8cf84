"""A module that no check may import: importing it raises (not ImportError), as a module with a
bug, or one that does something on import, would. Python consumer targets naming it test that
odal imports nothing outside ODAL_PYTHON_CONSUMERS, and refuses (422, never a 500) what raises."""

raise RuntimeError("tests.import_sentinel was imported")


def call(event, delivery_id):  # pragma: no cover (never reached)
    return None
