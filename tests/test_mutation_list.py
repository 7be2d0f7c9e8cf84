"""tests/mutations.py names each guard by its text: a refactor that moves or rewrites guarded code
must point the guard at its new place, or `make mutations` reports it STALE (hours later). These
check the list in a second, with the suite."""

import pathlib

import pytest

from tests import mutations

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("guard", mutations.GUARDS, ids=lambda g: g.name[:80])
def test_each_guard_names_text_found_once_and_its_mutant_is_code(guard):
    source = (ROOT / guard.path).read_text()
    assert source.count(guard.original) == 1, f"{guard.path}: the guard's text is not found exactly once"
    assert guard.mutant != guard.original
    if guard.path.endswith(".py"):
        compile(source.replace(guard.original, guard.mutant), guard.path, "exec")


def test_no_two_guards_share_a_name():
    names = [g.name for g in mutations.GUARDS]
    assert len(names) == len(set(names))
