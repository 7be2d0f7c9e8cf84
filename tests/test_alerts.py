"""docs/alerts.yml: every metric its expressions name is one /metrics exposes (a misspelt name
would make an alert that can never fire), and every alert points at a runbook section."""

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from outbox.sweep import sweep_once
from tests.factories import DeadDeliveryFactory, DeliveryFactory, RegistrationFactory

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "docs" / "alerts.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"

# PromQL words that are not metrics: functions and aggregations (always followed by "("), and
# the keywords below. Label matchers, ranges, strings and label lists are cut out first.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
            "offset", "bool", "inf", "nan"}  # fmt: skip
LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
CUT = re.compile(r'\{[^}]*\}|\[[^\]]*\]|"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    text = LABEL_LISTS.sub(" ", CUT.sub(" ", expr))
    return {name for name in IDENTIFIER.findall(text) if name.lower() not in KEYWORDS}


def unknown_metrics(document: dict, exposed: set[str]) -> list[tuple[str, str]]:
    """(alert, metric) for every metric an alert's expression names that is not in `exposed`."""
    return [
        (rule["alert"], name)
        for group in document["groups"]
        for rule in group["rules"]
        for name in sorted(metric_names(rule["expr"]))
        if name not in exposed
    ]


def exposed_metrics(client) -> set[str]:
    """Sample names on /metrics (counters with their _total), after making every labelled series
    exist: a consumer with one delivery in each status, a registration, and one sweep pass."""
    consumer = DeliveryFactory(status="delivered").consumer
    DeliveryFactory(consumer=consumer)
    DeadDeliveryFactory(consumer=consumer)
    RegistrationFactory()
    sweep_once()
    response = client.get("/metrics", headers={"Authorization": "Bearer alerts-test-token"})
    assert response.status_code == 200
    return {
        re.match(r"[A-Za-z_:][\w:]*", line).group()
        for line in response.content.decode().splitlines()
        if line and not line.startswith("#")
    }


@pytest.fixture
def document():
    return yaml.safe_load(ALERTS.read_text())


def test_metric_names_are_read_from_promql():
    expr = (
        'time() - max(outbox_last_pass_timestamp_seconds) > 300 and on() max(outbox_deliveries{status="pending"}) > 0'
        " or max by (consumer) (delta(outbox_deliveries{status='dead'}[1h] offset 5m)) > 1e3"
        " unless ignoring(instance) group_left(job) sum without (outcome) (rate(x_total[5m])) > bool 0"
    )
    assert metric_names(expr) == {"outbox_last_pass_timestamp_seconds", "outbox_deliveries", "x_total"}


@pytest.mark.django_db
def test_every_metric_an_alert_names_is_on_metrics(client, settings, document):
    settings.ODAL_METRICS_TOKEN = "alerts-test-token"
    exposed = exposed_metrics(client)
    named = {
        name for group in document["groups"] for rule in group["rules"] for name in metric_names(rule["expr"])
    }
    assert len(named) >= 10  # the check reads something: every metric of the rules
    assert unknown_metrics(document, exposed) == []


@pytest.mark.django_db
def test_a_misspelt_metric_in_a_rule_is_reported(client, settings, document):
    settings.ODAL_METRICS_TOKEN = "alerts-test-token"
    exposed = exposed_metrics(client)
    bad = copy.deepcopy(document)
    bad["groups"][0]["rules"].append(
        {
            "alert": "Misspelt",
            "expr": "max(increase(outbox_late_write_total[15m])) > 0 and on() max(registry_outbox_stalled) > 0",
        }
    )
    bad["groups"][0]["rules"].append({"alert": "NoTotal", "expr": "increase(registry_write_errors[5m]) > 0"})
    assert unknown_metrics(bad, exposed) == [
        ("Misspelt", "outbox_late_write_total"),
        ("NoTotal", "registry_write_errors"),
    ]


ALERTS_ASKED_FOR = {
    "OdalSweepStopped", "OdalDrainStopped", "OdalBacklogOld", "OdalConsumerPaused", "OdalDeadLettersGrowing", "OdalOutboxLateWrites",
    "OdalRegistryLateWrites", "OdalOutboxWriteErrors", "OdalRegistryWriteErrors", "OdalRegistrationsStalled",
    "OdalRegistryProtocolErrors", "OdalPythonConsumerBlocked",
}  # fmt: skip


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_is_complete_and_its_runbook_section_exists(document):
    anchors = {
        github_anchor(line.lstrip("#")) for line in RUNBOOK.read_text().splitlines() if line.startswith("#")
    }
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == ALERTS_ASKED_FOR
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert {"summary", "description", "runbook"} <= set(rule["annotations"])
        page, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert page == "docs/runbook.md" and anchor == f"alert-{rule['alert'].lower()}"
        assert anchor in anchors, (
            f"{rule['alert']}: no section '## Alert: {rule['alert']}' in docs/runbook.md"
        )


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules():
    result = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
