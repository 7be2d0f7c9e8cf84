"""Worker hosts in network namespaces, their links cut (make partition runs the long form).

The tests build namespaces and veth pairs, so they need root and `ip netns`, and say they
skipped when either is missing (CI runs as root)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import partition

ROOT = Path(__file__).resolve().parent.parent


def need(check) -> None:
    try:
        check()
    except partition.Refusal as exc:
        pytest.skip(f"skipped because {exc}")


def test_short_partition_run_finds_no_violation(tmp_path):
    need(partition.preconditions)
    figures_file = tmp_path / "partition.json"
    result = subprocess.run(
        [sys.executable, "tests/partition.py", "--hosts", "2", "--seconds", "20", "--settle", "15",
         "--long-every", "0", "--json", str(figures_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "partition: 0 violations" in result.stdout
    figures = json.loads(figures_file.read_text())
    # It must have exercised what it checks: links cut mid-attempt, processes killed, people's writes.
    assert sum(figures["partitions"].values()) >= 2 and figures["cuts_mid_attempt"] >= 1, figures
    assert sum(figures["kills"].values()) >= 3, figures
    assert figures["replayed"] > 0 and figures["audit_entries"]["registry_abandoned"] > 0, figures
    assert sum(figures["deliveries"].values()) == figures["deliveries_owed"] > 0
