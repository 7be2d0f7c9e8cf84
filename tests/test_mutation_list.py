"""tests/mutations.py names each guard by its text: a refactor that moves or rewrites guarded code
must point the guard at its new place, or `make mutations` reports it STALE (hours later). These
check the list in a second, with the suite."""

import pathlib
import re
import subprocess
import sys

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


def matches(expression: str, keywords: list[str]) -> bool:
    """pytest's -k, as far as the list uses it: words (a case-insensitive substring of one of the
    test's names: its own with its parameters, its class's, its file's), and, or, not, parentheses."""
    code = re.sub(
        r"(?:\w|:|\+|-|\.|\[|\]|\\|/)+",  # (pytest's own pattern of a -k word)
        lambda m: (
            m.group(0)
            if m.group(0) in ("and", "or", "not")
            else repr(any(m.group(0).lower() in k.lower() for k in keywords))
        ),
        expression,
    )
    # Quotes reach pytest as they are (no shell reads the list): '-k "a or b"' selects none, and
    # here it would be a string, true whatever it holds.
    assert re.fullmatch(r"[\w\s()]*", code), f"-k {expression}: only words, and, or, not, parentheses"
    return eval(code)  # noqa: S307 (True/False, and, or, not, parentheses: nothing else is left)


@pytest.fixture(scope="module")
def node_ids(request):
    """The test ids of a file, from this session's collection or, for a file it did not collect
    (this file run alone), from pytest's."""
    seen: dict[str, list[str]] = {}
    for item in request.session.items:
        seen.setdefault(item.nodeid.split("::")[0], []).append(item.nodeid)
    named = {path.split("::")[0] for g in mutations.GUARDS for path in g.tests.partition(" -k ")[0].split()}
    missing = sorted(file for file in named if file not in seen and (ROOT / file).exists())
    if missing:  # one collection for all of them
        listed = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *missing],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        for line in listed.stdout.splitlines():
            if "::" in line:
                seen.setdefault(line.split("::")[0], []).append(line)
    return lambda file: seen.get(file, [])


@pytest.mark.parametrize("guard", mutations.GUARDS, ids=lambda g: g.name[:80])
def test_each_guard_runs_at_least_one_test(guard, node_ids):
    """A guard whose tests select none was counted caught (pytest exits non-zero when it collects
    nothing): a renamed test, or a -k that no longer matches, would hide a surviving mutant."""
    paths, _, expression = guard.tests.partition(" -k ")
    for path in paths.split():
        file, _, name = path.partition("::")
        ids = node_ids(file)
        assert ids, f"{file}: no test collected"
        if name:
            assert any(i == path or i.startswith(f"{path}[") for i in ids), f"{path}: no such test"
        elif expression:
            names = [[*i.split("::")[1:], pathlib.Path(file).name] for i in ids]
            assert any(matches(expression, n) for n in names), f"{guard.tests}: -k selects no test"


def test_the_shards_together_are_the_whole_list_once():
    names = [g.name for g in mutations.GUARDS]
    halves = []
    for k in (1, 2, 3):
        got, of, words = mutations.shard([f"--shard={k}/3", "word"])
        assert (got, of, words) == (k, 3, ["word"])
        halves += names[got - 1 :: of]
    assert sorted(halves) == sorted(names)
    assert mutations.shard(["--shard", "2/2"]) == (2, 2, [])
    assert mutations.shard(["claim", "token"]) == (1, 1, ["claim", "token"])


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "", "-1/2", "²/2", "1/2\n", "1\x00/2"])
def test_a_shard_that_names_none_is_refused(text):
    with pytest.raises(SystemExit, match="--shard wants K/N"):
        mutations.shard(["--shard", text] if text else ["--shard"])
