"""The short form of the torture run (make torture runs the long one): real sweep and drain
processes killed at random, people replaying and abandoning, then every invariant checked."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_short_torture_run_finds_no_violation(tmp_path, unique_name):
    figures_file = tmp_path / "torture.json"
    result = subprocess.run(
        [sys.executable, "tests/torture.py", "--seconds", "25", "--registry-seconds", "15", "--settle", "5",
         "--events", "100", "--passports", "40", "--database", unique_name("torture"), "--json", str(figures_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "torture: 0 violations" in result.stdout
    figures = json.loads(figures_file.read_text())
    # The run must have exercised what it checks: kills, late writers, dead letters and replays.
    assert figures["sweep_kills"] > 0 and figures["drain_kills"] > 0
    assert figures["late_writes_refused"] > 0, figures
    assert figures["replayed"] > 0 and figures["audit_entries"]["registry_abandoned"] > 0, figures
