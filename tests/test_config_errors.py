"""Issue 24 (from item 8): configuration errors stop start-up with exit 1 naming the variable: a
libpq option libpq would refuse (before: exit 4, "the database does not answer, try again", though
no retry can help) and a URL's impossible port (before: taken, failing only when first used)."""

import os
import subprocess
import sys

import pytest

from tests.test_settings import environment, read_settings, refusal


def odal(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "odal", *args],
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bad_sslmode_is_a_configuration_error_not_a_database_that_does_not_answer():
    url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    result = odal("outbox", "status", DATABASE_URL=url.partition("?")[0] + "?sslmode=bogus")
    print(result.returncode, result.stderr)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("odal cannot start: DATABASE_URL's sslmode must be one of disable, allow")
    assert "does not answer" not in result.stderr


@pytest.mark.parametrize(
    "query, said",
    [
        ("sslmode=bogus", "DATABASE_URL's sslmode must be one of"),
        ("gssencmode=always", "DATABASE_URL's gssencmode must be one of"),
        ("target_session_attrs=writable", "DATABASE_URL's target_session_attrs must be one of"),
        ("connect_timeout=soon", "DATABASE_URL's connect_timeout must be a whole number"),
        ("keepalives_idle=5s", "DATABASE_URL's keepalives_idle must be a whole number"),
        ("sslmdoe=require", 'DATABASE_URL has a connection option libpq does not know: invalid connection option "sslmdoe"'),
    ],
)  # fmt: skip
def test_a_libpq_option_libpq_would_refuse_stops_start_up_naming_database_url(query, said):
    assert refusal(DATABASE_URL=f"postgres://odal@db.internal:5432/odal?{query}").startswith(said)


@pytest.mark.parametrize(
    "query", ["sslmode=verify-full", "target_session_attrs=read-write", "connect_timeout=5"]
)
def test_libpq_options_libpq_takes_are_taken(query):
    read_settings(DATABASE_URL=f"postgres://odal@db.internal:5432/odal?{query}")


@pytest.mark.parametrize(
    "name, url",
    [
        ("ODAL_REGISTRY_URL", "http://registry.example.eu:99999"),
        ("ODAL_REGISTRY_URL", "https://registry.example.eu:0/api"),
        ("ODAL_REGISTRY_URL", "http://[::1]:65536/"),
        ("ODAL_PUBLIC_URL", "https://dpp.example.eu:123456"),
        ("ODAL_BROKER_URL", "redis://redis.internal:99999/0"),
        ("DATABASE_URL", "postgres://odal@db.internal:99999/odal"),
        ("DATABASE_URL", "postgres://odal@db.internal:0/odal"),
    ],
)
def test_a_url_with_an_impossible_port_stops_start_up_naming_the_variable(name, url):
    said = refusal(**{name: url})
    print(said)
    assert said.startswith(f"{name} must name a port from 1 to 65,535"), said


@pytest.mark.parametrize(
    "name, url",
    [
        ("ODAL_REGISTRY_URL", "http://[::1"),
        ("ODAL_PUBLIC_URL", "https://[dpp.example.eu]/"),
        ("ODAL_BROKER_URL", "redis://[::1"),
        ("DATABASE_URL", "postgres://odal@[::1/odal"),
    ],
)
def test_a_url_no_parser_can_read_stops_start_up_naming_the_variable(name, url):
    # (urlparse's ValueError was a traceback: "Invalid IPv6 URL")
    said = refusal(**{name: url})
    assert said.startswith(f"{name} must be a valid URL ("), said


@pytest.mark.parametrize(
    "url", ["postgres://", "postgresql://odal@db.internal:5432", "postgres://odal@db.internal/"]
)
def test_a_database_url_naming_no_database_stops_start_up(url):
    # (Django refused it only when it first connected: a traceback from the first command)
    assert refusal(DATABASE_URL=url).startswith("DATABASE_URL must name a database"), url


def test_odal_exits_1_on_a_registry_url_with_an_impossible_port():
    result = odal("check", ODAL_REGISTRY_URL="http://127.0.0.1:99999")
    print(result.returncode, result.stderr)
    assert result.returncode == 1
    assert result.stderr.startswith("odal cannot start: ODAL_REGISTRY_URL must name a port from 1 to 65,535")


@pytest.mark.parametrize(
    "name, url",
    [
        ("ODAL_REGISTRY_URL", "http://[::1]:8100"),
        ("ODAL_REGISTRY_URL", "https://registry.example.eu"),
        ("ODAL_REGISTRY_URL", "http://registry.example.eu:65535/api"),
        ("ODAL_BROKER_URL", "redis://:pw@redis.internal:6379/0"),
        ("DATABASE_URL", "postgres://odal:pw@[::1]:5432/odal"),
    ],
)
def test_urls_with_possible_ports_are_taken(name, url):
    read_settings(**{name: url})


@pytest.fixture
def empty_database():
    """A PostgreSQL database with no table in it (odal never migrated there), dropped after."""
    import uuid

    import psycopg

    server = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    name = f"odal_unmigrated_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{server}/{name}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_database_odal_never_migrated_is_a_sentence_saying_to_migrate(empty_database):
    # (a ProgrammingError's traceback, "relation … does not exist")
    result = odal("outbox", "status", DATABASE_URL=empty_database)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    said = result.stderr.strip().splitlines()[-1]
    assert said.startswith("odal: the database has no table ") and "run `odal migrate` first" in said, said


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("command", [["help"], ["--version"]], ids=["more-than-a-buffer", "one-line"])
def test_output_to_a_reader_that_went_ends_quietly(command, buffered):
    # `odal help | head -1`: the reader closes; the next write meets a broken pipe (a traceback;
    # a line kept in the buffer met it as it was flushed at exit: "Exception ignored", exit 120).
    # The pipe's read end is closed before the command starts, so its first write meets one.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "odal", *command],
            env={
                k: v
                for k, v in environment(PYTHONUNBUFFERED="1").items()
                if not (buffered and k == "PYTHONUNBUFFERED")
            },
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr == "", result.stderr[-2000:]
