"""odal.core.env's typed readers, one by one: what each answers, and the sentence with which it
refuses a value (the same sentence start-up stops with: tests/test_settings.py reads them
through odal/settings.py)."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from odal.core import env

NAME = "ODAL_TEST_KNOB"  # a variable no setting reads


def read(monkeypatch, value, reader, *args, **kwargs):
    """What `reader(NAME, *args, **kwargs)` answers with NAME set to `value` (None: unset)."""
    if value is None:
        monkeypatch.delenv(NAME, raising=False)
    else:
        monkeypatch.setenv(NAME, value)
    return reader(NAME, *args, **kwargs)


def refused(monkeypatch, value, reader, *args, **kwargs) -> str:
    with pytest.raises(ImproperlyConfigured) as refusal:
        read(monkeypatch, value, reader, *args, **kwargs)
    return str(refusal.value)


@pytest.mark.parametrize(
    "value, bounds, said",
    [
        ("five", {}, f"{NAME} must be a whole number, got 'five'"),
        ("1.5", {}, f"{NAME} must be a whole number, got '1.5'"),
        ("0", {"minimum": 1}, f"{NAME} must be at least 1, got 0"),
        ("-1", {}, f"{NAME} must be at least 0, got -1"),
        ("65", {"minimum": 1, "maximum": 64}, f"{NAME} must be between 1 and 64, got 65"),
    ],
)
def test_env_int_refuses_what_is_no_whole_number_or_out_of_bounds(monkeypatch, value, bounds, said):
    assert refused(monkeypatch, value, env.env_int, 8, **bounds) == said


@pytest.mark.parametrize("value, answer", [(None, 8), ("", 8), ("  ", 8), (" 64 ", 64), ("1", 1)])
def test_env_int_reads_a_whole_number_within_bounds_or_the_default(monkeypatch, value, answer):
    assert read(monkeypatch, value, env.env_int, 8, minimum=1, maximum=64) == answer


def test_env_int_may_default_to_none(monkeypatch):
    assert read(monkeypatch, " ", env.env_int, None, maximum=3600) is None
    assert read(monkeypatch, "0", env.env_int, None, maximum=3600) == 0


def test_env_bool_refuses_what_is_neither_true_nor_false(monkeypatch):
    assert refused(monkeypatch, "maybe", env.env_bool, True) == f"{NAME} must be true or false, got 'maybe'"


@pytest.mark.parametrize("value, answer", [(None, True), ("Off", False), ("no", False), ("YES", True)])
def test_env_bool_reads_the_usual_spellings(monkeypatch, value, answer):
    assert read(monkeypatch, value, env.env_bool, True) is answer


def test_env_choice_refuses_what_is_not_a_choice(monkeypatch):
    said = refused(monkeypatch, "soap", env.env_choice, "http", ("http", "none"))
    assert said == f"{NAME} must be one of http, none, got 'soap'"
    assert read(monkeypatch, " ", env.env_choice, "http", ("http", "none")) == "http"


@pytest.mark.parametrize(
    "value, said",
    [
        ("0", f"{NAME} must be a number of requests per second above 0 and at most 10,000, or unset for no limit; got '0'"),
        ("nan", f"{NAME} must be a number of requests per second above 0 and at most 10,000, or unset for no limit; got 'nan'"),
        ("100/s", f"{NAME} must be a number of requests per second above 0 and at most 10,000, or unset for no limit; got '100/s'"),
        ("0.001", f"{NAME} must be at least 0.01 (one in a hundred seconds); got '0.001'"),
    ],
)  # fmt: skip
def test_env_rate_refuses_no_rate_or_one_below_its_minimum(monkeypatch, value, said):
    kwargs = {"maximum": 10_000, "minimum": 0.01, "why_minimum": "one in a hundred seconds"}
    assert refused(monkeypatch, value, env.env_rate, **kwargs) == said


def test_env_rate_unset_is_no_limit(monkeypatch):
    assert read(monkeypatch, None, env.env_rate, maximum=10) is None
    assert read(monkeypatch, "0.5", env.env_rate, maximum=10) == 0.5


@pytest.mark.parametrize(
    "value, said",
    [
        ("24", f"{NAME} must be a duration such as 24h, 90m or 7d, or off; got '24'"),
        ("1w", f"{NAME} must be a duration such as 24h, 90m or 7d, or off; got '1w'"),
        ("30s", f"{NAME} must be from 60 seconds to 365 days, got '30s'"),
        ("400d", f"{NAME} must be from 60 seconds to 365 days, got '400d'"),
    ],
)
def test_env_duration_refuses_no_duration_or_one_out_of_bounds(monkeypatch, value, said):
    assert (
        refused(monkeypatch, value, env.env_duration, "24h", low_seconds=60, high_seconds=365 * 86400) == said
    )


@pytest.mark.parametrize("value, answer", [(None, 86400), ("90m", 5400), ("OFF", None)])
def test_env_duration_reads_seconds_or_off(monkeypatch, value, answer):
    assert (
        read(monkeypatch, value, env.env_duration, "24h", low_seconds=60, high_seconds=365 * 86400) == answer
    )


def test_env_list_drops_blanks_and_spaces(monkeypatch):
    assert read(monkeypatch, " a.example , ,b.example ", env.env_list) == ["a.example", "b.example"]
    assert read(monkeypatch, None, env.env_list) == []


@pytest.mark.parametrize(
    "value, said",
    [
        ("ftp://odal:Secr3t-pw@registry.internal/", f"{NAME} must be a http or https URL, got 'ftp://odal:***@registry.internal/'"),
        ("http://registry.internal:99999", f"{NAME} must name a port from 1 to 65,535, got '99999' in 'http://registry.internal:99999'"),
    ],
)  # fmt: skip
def test_env_url_refuses_another_scheme_or_an_impossible_port(monkeypatch, value, said):
    assert refused(monkeypatch, value, env.env_url, "http://127.0.0.1:8100", ("http", "https")) == said


def test_env_url_reads_the_url_without_its_trailing_slash(monkeypatch):
    assert read(monkeypatch, "https://registry.example/api/", env.env_url, "x", ("http", "https")) == (
        "https://registry.example/api"
    )


@pytest.mark.parametrize(
    "value, said",
    [
        ("amqp://odal:Secr3t-pw@mq.internal/", f"{NAME} must be a redis:// URL, got 'amqp://odal:***@mq.internal/'"),
        ("redis://redis.internal:0/0", f"{NAME} must name a port from 1 to 65,535, got '0' in 'redis://redis.internal:0/0'"),
    ],
)  # fmt: skip
def test_env_redis_url_refuses_another_scheme_or_an_impossible_port(monkeypatch, value, said):
    assert refused(monkeypatch, value, env.env_redis_url) == said


def test_env_redis_url_unset_is_none(monkeypatch):
    assert read(monkeypatch, " ", env.env_redis_url) == ""


def test_env_address_and_env_python_consumers_refuse_with_their_rules_sentence(monkeypatch):
    said = refused(monkeypatch, "nonsense", env.env_address, "127.0.0.1:8000")
    assert said.startswith(f"{NAME} ") and said.endswith(", got 'nonsense'"), said
    said = refused(monkeypatch, "not a path", env.env_python_consumers, "outbox.receiver.*")
    assert said.startswith(f"{NAME} ") and said.endswith(", got 'not a path'"), said


@pytest.mark.parametrize(
    "variables, said",
    [
        ({"DATABASE_URL": "mysql://odal:Secr3t-pw@db/odal"}, "DATABASE_URL must be a postgres:// URL, got 'mysql://odal:***@db/odal'"),
        ({"DATABASE_URL": "sqlite:///var/odal.sqlite3"}, "DATABASE_URL is a SQLite URL, and odal runs on PostgreSQL only: set DATABASE_URL to a postgres://user@host:port/odal URL, or unset it to use the embedded PostgreSQL under var/pg"),
        ({"DATABASE_URL": "postgres://db:70000/odal"}, "DATABASE_URL must name a port from 1 to 65,535, got '70000' in 'postgres://db:70000/odal'"),
        ({"DATABASE_URL": "postgres://db/odal?sslmode=sometimes"}, "DATABASE_URL's sslmode must be one of disable, allow, prefer, require, verify-ca, verify-full, got 'sometimes'"),
        ({"DATABASE_URL": "postgres://db/odal", "ODAL_DB_CONN_MAX_AGE": "forever"}, "ODAL_DB_CONN_MAX_AGE must be a whole number, got 'forever'"),
    ],
)  # fmt: skip
def test_database_from_env_refuses_what_no_connection_could_use(monkeypatch, variables, said):
    monkeypatch.delenv("ODAL_DB_CONN_MAX_AGE", raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured) as refusal:
        env.database_from_env("postgres://unused/odal")
    assert str(refusal.value) == said
