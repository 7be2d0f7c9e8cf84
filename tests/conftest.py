import pytest
from django.conf import settings
from django.test import Client

from tests.factories import issue_token


def pytest_configure(config):
    # The suite runs on PostgreSQL only (make test finds one): SQLite would hide the locking
    # and the triggers odal relies on.
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise pytest.UsageError("Run the suite with `make test`: it needs PostgreSQL (DATABASE_URL).")


class ApiClient:
    """The Django test client through the real URLconf, with a bearer token and JSON bodies."""

    def __init__(self, token: str | None):
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def get(self, path, **params):
        return self.client.get(f"/vault/api/v1/{path}", params, headers=self.headers)

    def post(self, path, body=None, **extra):
        return self.client.post(
            f"/vault/api/v1/{path}",
            body if body is not None else {},
            content_type="application/json",
            headers=self.headers,
            **extra,
        )

    def patch(self, path, body=None):
        return self.client.patch(
            f"/vault/api/v1/{path}", body if body is not None else {}, content_type="application/json",
            headers=self.headers,
        )  # fmt: skip

    def delete(self, path, body=None):
        return self.client.delete(
            f"/vault/api/v1/{path}", body if body is not None else {}, content_type="application/json",
            headers=self.headers,
        )  # fmt: skip


@pytest.fixture
def api_as():
    def make(scope: str | None = "admin") -> ApiClient:
        return ApiClient(issue_token(scope) if scope else None)

    return make


@pytest.fixture
def admin_api(api_as):
    return api_as("admin")


@pytest.fixture(autouse=True)
def _no_kicks(settings):
    """Tests sweep and drain by hand; the django-q2 tests switch kicks back on. The registry is
    nowhere (a closed port) unless a test starts the simulator (registry_sim)."""
    settings.ODAL_KICK_SWEEP = False
    settings.ODAL_REGISTRY_URL = "http://127.0.0.1:9"


@pytest.fixture(scope="session")
def registry_simulator():
    """One registry simulator on a free local port for the whole run (a server per test cost half
    a second each to shut down); registry_sim resets it for each test."""
    import threading

    from registry.simulator import make_server

    server = make_server(port=0, token="sim-token")
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def registry_sim(registry_simulator, settings):
    """The registry simulator, forgetting all it held and every fault, with the node's http
    adapter pointed at it."""
    registry_simulator.state.reset()
    settings.ODAL_REGISTRY_ADAPTER = "http"
    settings.ODAL_REGISTRY_URL = f"http://127.0.0.1:{registry_simulator.server_address[1]}"
    settings.ODAL_REGISTRY_TOKEN = "sim-token"
    settings.ODAL_REGISTRY_TIMEOUT_SECONDS = 2
    settings.ODAL_REGISTRY_CHECK_SECONDS = 0  # submitted rows are due for a check at once
    settings.ODAL_BACKOFF_BASE_SECONDS = 0
    return registry_simulator.state


def pytest_terminal_summary(terminalreporter):
    import sys

    fuzz = sys.modules.get("tests.test_fuzz")
    for line in fuzz.fuzz_summary() if fuzz else []:
        terminalreporter.write_line(line)
    restart = sys.modules.get("tests.test_db_restart")
    for line in restart.FIGURES if restart else []:
        terminalreporter.write_line(line)
