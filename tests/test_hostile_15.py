"""Hostile review of issue 15 (`odal serve`, riding out a lost database, the Redis broker, the
partition run): what broke, kept broken no more."""

import pytest

from odal.core import rules
from odal.settings import DEFAULT_SECRET_KEY
from tests.pg import free_port
from tests.test_serve import production, refused
from tests.test_settings import read_settings, refusal

# -- production refuses a blank SECRET_KEY ---------------------------------------------------------------
# Before: SECRET_KEY="" (an EnvironmentFile line `SECRET_KEY=` whose secret did not make it) passed
# the production refusal; `odal serve` started and every request was a 500 (Django refuses an empty
# key only when something is signed).

PRODUCTION = {"ODAL_ENV": "production", "ALLOWED_HOSTS": "dpp.example.eu", "ODAL_METRICS_TOKEN": "m" * 32}


@pytest.mark.parametrize("key", ["", "   ", "\t"], ids=["empty", "spaces", "tab"])
def test_production_refuses_a_blank_secret_key(key):
    said = refusal(**PRODUCTION, SECRET_KEY=key)
    assert said.startswith("SECRET_KEY must be set"), said


@pytest.mark.parametrize("key", ["", "  "], ids=["empty", "spaces"])
def test_a_blank_secret_key_is_the_development_default_outside_production(key):
    assert read_settings(SECRET_KEY=key)["SECRET_KEY"] == DEFAULT_SECRET_KEY


def test_a_secret_key_of_its_own_is_kept_as_it_is():
    key = " s3cret-of-our-own-" * 3 + " "  # (as long and as varied as Django's deploy check asks)
    assert read_settings(**PRODUCTION, SECRET_KEY=key)["SECRET_KEY"] == key


def test_odal_serve_refuses_a_blank_secret_key_in_production(tmp_path):
    env = production(tmp_path / "static", SECRET_KEY="")
    returncode, stderr = refused("--bind", f"127.0.0.1:{free_port()}", "--workers", "1", env=env)
    assert returncode == 1, stderr
    assert "SECRET_KEY" in stderr and "ODAL_ENV=production" in stderr
    assert not (tmp_path / "static").exists()


# -- --bind and ODAL_BIND: what gunicorn can listen on, or a usage error -----------------------------------
# Before: a host with an empty or over-long label ("...:8000", "a..b:8000") passed the rule and
# made the resolver raise UnicodeError: a traceback. An IPv6 address without brackets ("::1:8000")
# or with one ("[::1:8000") passed it too, and gunicorn then refused "'' is not a valid port number".

NOT_LISTENABLE = [
    "...:8000",
    "a..b:8000",
    ".:8000",
    "a" * 64 + ":8000",
    "::1:8000",
    "[::1:8000",
    "[nonsense]:8000",
    "[127.0.0.1]:8000",
    "[]:8000",
    "[::1%\x00]:8000",
]


@pytest.mark.parametrize("value", NOT_LISTENABLE)
def test_the_address_rule_refuses_what_gunicorn_cannot_listen_on(value):
    with pytest.raises(ValueError, match="HOST:PORT"):
        rules.address(value)


@pytest.mark.parametrize(
    "value, address",
    [
        ("[::1]:8000", "[::1]:8000"),
        ("[fe80::1%lo]:8000", "[fe80::1%lo]:8000"),
        ("0.0.0.0:8000", "0.0.0.0:8000"),
        ("dpp.example.eu.:443", "dpp.example.eu.:443"),
        ("localhost:08000", "localhost:8000"),
        ("8000", "127.0.0.1:8000"),
        ("a" * 63 + ":8000", "a" * 63 + ":8000"),
    ],
)
def test_the_address_rule_still_takes_what_gunicorn_listens_on(value, address):
    assert rules.address(value) == address


@pytest.mark.parametrize("value", ["...:18735", "::1:18735"])
def test_odal_serve_refuses_a_bind_it_cannot_listen_on_as_a_usage_error(tmp_path, value):
    returncode, stderr = refused("--bind", value, "--workers", "1", env=production(tmp_path / "static"))
    assert returncode == 2, stderr
    assert "--bind" in stderr and "HOST:PORT" in stderr
    assert not (tmp_path / "static").exists()


def test_odal_bind_with_an_empty_label_stops_start_up_naming_it():
    assert "ODAL_BIND" in refusal(ODAL_BIND="a..b:8000")


# -- the admin's lists, filtered on a NUL ---------------------------------------------------------------
# Before: `GET /admin/odal/passport/?status__exact=%00` (any list filter, or a lookup the admin
# allows, given a NUL) reached PostgreSQL, which cannot compare text with a NUL: a 500.

ADMIN_ADDRESSES = [
    "/admin/odal/passport/?status__exact=%00",
    "/admin/odal/passport/?upi=%00",
    "/admin/odal/auditentry/?action__exact=%00",
    "/admin/registry/registration/?status=%00",
    "/admin/outbox/consumer/?kind__exact=%00",
    "/admin/outbox/event/?type__exact=%00",
    "/admin/odal/passport/?q=%00",
    "/admin/odal/passport/?x%00=1",
    "/admin/odal/passport/%00/change/",
]


@pytest.mark.django_db
@pytest.mark.parametrize("address", ADMIN_ADDRESSES)
def test_an_admin_address_with_nul_is_a_400_not_a_500(admin_client, address):
    response = admin_client.get(address)
    assert response.status_code == 400, address


@pytest.mark.django_db
def test_the_api_still_answers_a_nul_in_its_query_with_its_own_422(admin_client):
    response = admin_client.get("/vault/api/v1/outbox/deliveries?consumer=%00")
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_request"


@pytest.mark.django_db
def test_an_admin_list_without_nul_still_answers(admin_client):
    assert admin_client.get("/admin/odal/passport/?status__exact=draft&q=x").status_code == 200


# -- the partition run: its own checks, and its clean-up when it runs too long ---------------------------
# Before: invariants.check() counts deliveries (events x consumers) and nothing checked where they
# ended, so a run whose deliveries stayed pending for good (a claim nobody ended, a sweep that
# stopped) printed "0 violations". And the short run inside `make test` was bounded by
# subprocess.run's timeout, which SIGKILLs the driver: its namespaces, the hosts' clusters and
# sweeps, its PostgreSQL and Redis stayed up until the next run.


@pytest.mark.django_db
def test_the_partition_run_counts_a_delivery_left_pending_as_a_violation():
    from outbox.models import Delivery
    from tests import partition
    from tests.factories import DeadDeliveryFactory, DeliveryFactory

    DeliveryFactory()
    DeadDeliveryFactory()
    assert partition.unsettled() == [
        "1 deliveries still dead after the settle time",
        "1 deliveries still pending after the settle time",
    ]
    Delivery.objects.update(status="delivered")
    assert partition.unsettled() == []


CLEANS_UP = """
import signal, sys, time
def clean_up(*_):
    open(sys.argv[1], "w").write("cleaned up")
    sys.exit(130)
signal.signal(signal.SIGTERM, clean_up)
print("started", flush=True)
time.sleep(60)
"""


def test_a_partition_run_past_its_time_is_stopped_through_its_clean_up(tmp_path):
    import subprocess
    import sys

    from tests import partition

    marker = tmp_path / "cleaned"
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        partition.run_bounded([sys.executable, "-c", CLEANS_UP, str(marker)], timeout=2, grace=10)
    assert marker.read_text() == "cleaned up"
    assert "started" in timed_out.value.output
