"""Worker hosts in network namespaces, their links cut (make partition runs the long form).

Both tests build namespaces and veth pairs, so they need root and `ip netns`, and say they
skipped when either is missing (CI runs as root)."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import partition

ROOT = Path(__file__).resolve().parent.parent


def need(check) -> None:
    try:
        check()
    except partition.Refusal as exc:
        pytest.skip(f"skipped because {exc}")


@pytest.mark.slow
def test_short_partition_run_finds_no_violation(tmp_path):
    need(partition.preconditions)
    figures_file = tmp_path / "partition.json"
    result = partition.run_bounded(
        [sys.executable, "tests/partition.py", "--hosts", "2", "--seconds", "20", "--settle", "30",
         "--long-every", "0", "--json", str(figures_file)],
        cwd=ROOT, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "partition: 0 violations" in result.stdout
    figures = json.loads(figures_file.read_text())
    # It must have exercised what it checks: links cut mid-attempt, processes killed, people's writes.
    assert sum(figures["partitions"].values()) >= 2 and figures["cuts_mid_attempt"] >= 1, figures
    assert sum(figures["kills"].values()) >= 3, figures
    assert figures["replayed"] > 0 and figures["audit_entries"]["registry_abandoned"] > 0, figures
    assert sum(figures["deliveries"].values()) == figures["deliveries_owed"] > 0


# A host's registry adapter, in its namespace: one register to open a connection, then (once told,
# its link cut) another, which times out; the process stays on.
HOST = """
import os, sys, time, types, uuid
import django
django.setup()
from registry.adapters import HttpRegistry, Retryable
adapter = HttpRegistry(base_url=sys.argv[1], token="t", timeout=1.0)
def registration(upi):
    passport = types.SimpleNamespace(upi=upi, operator_id="OP", facility_id="", commodity_code="", pk=uuid.uuid4())
    return types.SimpleNamespace(passport=passport, pk=uuid.uuid4())
adapter.register(registration("https://id.example.eu/01/1/21/FIRST"))
print("connected", flush=True)
sys.stdin.readline()
try:
    adapter.register(registration("https://id.example.eu/01/1/21/CUT-OFF"))
    print("answered", flush=True)
except Retryable as exc:
    print(f"gave up: {exc}", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_register_given_up_during_a_cut_never_reaches_the_registry_after_the_heal(tmp_path):
    """The request waits in the host's send queue while the link is down; the adapter times out
    and records a failed attempt. Were the kernel to send it once the link heals, the registry
    would hold a submission for a row odal counts as not submitted (and a person may abandon)."""
    need(partition.need_namespaces)
    from registry.simulator import make_server

    with partition.exclusive():
        network = partition.Network(1)
        network.build()
        sim = make_server(partition.SERVICE_ADDR, 0, token="t")
        threading.Thread(target=sim.serve_forever, args=(0.05,), daemon=True).start()
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "odal.settings",
               "DATABASE_URL": "postgres://unused@127.0.0.1:9/unused"}  # fmt: skip
        host = subprocess.Popen(
            ["ip", "netns", "exec", network.namespace(1), sys.executable, "-c", HOST,
             f"http://{partition.SERVICE_ADDR}:{sim.server_address[1]}"],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        held = lambda: sorted(r["upi"].rsplit("/", 1)[1] for r in sim.state.requests.values())  # noqa: E731
        try:
            assert host.stdout.readline().strip() == "connected"
            network.cut(1, "service")
            host.stdin.write("go\n")
            host.stdin.flush()
            assert host.stdout.readline().startswith("gave up: registry timed out")
            # Heal once the copies queued while the host's neighbour lookup ran (about 3 s: the
            # link is down) are dropped: what could go out later is what TCP would retransmit.
            time.sleep(4)
            network.heal(1, "service")
            deadline = time.monotonic() + 6  # the next retransmission, 6.2 s after the first send
            while time.monotonic() < deadline and held() == ["FIRST"]:
                time.sleep(0.1)
            assert held() == ["FIRST"]
        finally:
            host.kill()
            host.wait()
            sim.shutdown()
            sim.server_close()
