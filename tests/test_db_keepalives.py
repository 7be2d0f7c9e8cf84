"""odal's PostgreSQL connections notice a dead peer within seconds, on both ends: the client
(libpq keepalives and tcp_user_timeout) and its backend on the server (the same settings, sent
in the connection's options). make partition shows what they are for: a host cut off from the
database for longer than that has no backend left holding rows there."""

import os

import pytest
from django.db import connection

SERVER_SETTINGS = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "10000",
}


@pytest.mark.django_db
def test_the_connection_and_its_backend_give_a_dead_peer_up_within_seconds():
    with connection.cursor() as cursor:
        for name, value in SERVER_SETTINGS.items():
            cursor.execute(f"SHOW {name}")
            assert cursor.fetchone()[0] == value, name
    client = connection.connection.info.get_parameters()
    assert {k: client.get(k) for k in ("keepalives", "keepalives_idle", "keepalives_interval",
                                       "keepalives_count", "tcp_user_timeout")} == {
        "keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "2", "keepalives_count": "3",
        "tcp_user_timeout": "10000",
    }  # fmt: skip


def test_database_url_settings_win_over_the_defaults():
    url = "postgres://odal@127.0.0.1:5432/odal?keepalives_idle=30&options=-c%20statement_timeout%3D5000"
    from tests.test_settings import read_settings

    o = read_settings(base=dict(os.environ), DATABASE_URL=url)["DATABASES"]["default"]["OPTIONS"]
    assert [str(o["keepalives_idle"]), str(o["keepalives_count"]), o["options"]] == [
        "30",
        "3",
        "-c statement_timeout=5000",
    ]
