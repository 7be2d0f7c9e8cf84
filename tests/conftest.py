import os
import sys
import threading
from collections import Counter

import pytest
from django.conf import settings
from django.test import Client

from tests.factories import issue_token, password_hash


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(WorkerFigures(), "odal-worker-figures")
    # make test (tests/pg.py) finds a PostgreSQL server, or starts an embedded one, and names it.
    if not os.environ.get("DATABASE_URL", "").strip():
        raise pytest.UsageError(
            "Run the suite with `make test`: tests/pg.py finds or starts its PostgreSQL (DATABASE_URL)."
        )
    if "tests.consumers.*" not in settings.ODAL_PYTHON_CONSUMERS:
        raise pytest.UsageError(
            "Run the suite with `make test` (tests/pg.py): its Python consumers (tests.consumers.*) must be "
            "allowed by ODAL_PYTHON_CONSUMERS, for it and for every process it starts."
        )


def _kind(item) -> int:
    """0: no database, 1: a database test rolled back, 2: a transactional one (pytest-django's
    own classification)."""
    marker = item.get_closest_marker("django_db")
    fixtures = getattr(item, "fixturenames", ())
    if (marker and (marker.kwargs.get("transaction") or marker.kwargs.get("reset_sequences"))) or {
        "transactional_db",
        "live_server",
    } & set(fixtures):
        return 2
    return 1 if marker or "db" in fixtures else 0


@pytest.hookimpl(trylast=True)  # after the conftests that mark (tests/browser) and after -k
def pytest_collection_finish(session):
    # Importing odal.wsgi (tests/test_fuzz.py does, to call the API in-process) marks the process
    # a web server, whose statements wait at most 10 s. The suite is not one: its own connections
    # keep a worker's bounds (odal.core.database), as a test that waits on a subprocess needs.
    from odal.core import database

    database.role = database.WORKER


def pytest_collection_modifyitems(items):
    """Tests without a database first, then the rolled-back ones, the transactional ones last
    (they empty the tables, the rows the migrations made included); within each, those marked
    slow first. pytest-django ran first and put the tests without a database last: their long
    ones (the torture run, the malformed-CLI processes) then ran alone at the end of a run split
    over pytest-xdist workers, as would any long test near the end."""
    items.sort(key=lambda item: (_kind(item), item.get_closest_marker("slow") is None))


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

    def patch(self, path, body=None, headers=None):
        return self.client.patch(
            f"/vault/api/v1/{path}", body if body is not None else {}, content_type="application/json",
            headers={**self.headers, **(headers or {})},
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


@pytest.fixture
def admin_user(db, django_user_model):
    """pytest-django's admin user (admin, password "password", behind admin_client), with its
    password hashed once per run instead of once per test."""
    manager = django_user_model._default_manager
    user = manager.filter(username="admin").first() or manager.create_superuser(
        username="admin", password=None
    )
    user.password = password_hash("password")
    user.save(update_fields=["password"])
    return user


@pytest.fixture(autouse=True)
def _broker_not_resting():
    """A kick the broker failed rests this process's kicks (odal.work.wake): not into the next test."""
    from odal.work import wake as kick

    kick._rest_until = float("-inf")


@pytest.fixture(autouse=True)
def _python_runner_leaves_no_connection():
    """The Python runner thread is the process's, kept from one test to the next as it is from one
    pass to the next, and a consumer that used the database leaves that thread's connection open:
    closed after each test, so no test counts another's connection (tests/test_reconnect.py counts
    them) and the test database can be dropped at the end."""
    yield
    from django.db import connections

    from outbox import python_consumers

    runner = python_consumers.RUNNER
    if runner is not None and runner.thread.is_alive():
        closed = threading.Event()
        runner.jobs.put(lambda: (connections.close_all(), closed.set()))
        closed.wait(5)


@pytest.fixture(autouse=True)
def _no_kicks(settings):
    """Tests sweep and drain by hand; the django-q2 tests switch kicks back on. The registry is
    nowhere (a closed port) unless a test starts the simulator (registry_sim)."""
    settings.ODAL_KICK_SWEEP = False
    settings.ODAL_REGISTRY_URL = "http://127.0.0.1:9"


def run_name() -> str:
    """A name of this run's own: the test database's name, which carries ODAL_TEST_DATABASE (one
    per helper or suite) and, under pytest-xdist, the worker (test_odal_gw0, test_odal_gw1…).
    Name whatever else a test makes that others could share after it: a database
    (f"{run_name()}_torture"), a Redis key prefix, a folder, a network namespace."""
    database = settings.DATABASES["default"]
    name = (database.get("TEST") or {}).get("NAME") or f"test_{database['NAME']}"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    # pytest-django adds the worker to the test database's name once that database is set up
    return f"{name}_{worker}" if worker and not name.endswith(f"_{worker}") else name


@pytest.fixture(scope="session")
def unique_name():
    """unique_name("torture") -> "test_odal_speed_gw0_torture": see run_name."""
    return lambda what: f"{run_name()}_{what}"


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Captured output as valid UTF-8: tests log lone surrogates on purpose (tests/test_logs.py),
    and pytest-xdist cannot send such text from a worker (its report would kill the worker)."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8")) for title, text in report.sections
    ]


def run_figures() -> dict:
    """What this process measured for the end of the run's output: the fuzz requests sent (by
    operation and status), the database restart's figures."""
    fuzz, restart = sys.modules.get("tests.test_fuzz"), sys.modules.get("tests.test_db_restart")
    return {
        "fuzz": [[list(key) if isinstance(key, tuple) else key, n] for key, n in fuzz.SENT.items()]
        if fuzz
        else [],
        "restart": list(restart.FIGURES) if restart else [],
    }


def fuzz_summary(sent: Counter) -> list[str]:
    sent = Counter(sent)
    hostile = sent.pop("hostile", 0)
    if not sent:
        return []
    by_status = Counter()
    for (_, status), n in sent.items():
        by_status[status] += n
    operations = len({label for label, _ in sent})
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(by_status.items()))
    verdict = "5xx found" if any(status >= 500 for status in by_status) else "no 5xx"
    return [
        f"fuzz: {sum(sent.values())} generated requests ({hostile} with hostile input) over {operations} "
        f"operations ({statuses}); {verdict}"
    ]


class WorkerFigures:
    """Under pytest-xdist the tests run in the workers: each sends its run_figures() when it ends
    (pytest_sessionfinish below), and the controller, which prints the summary, collects them."""

    def __init__(self):
        self.received: list[dict] = []

    def pytest_testnodedown(self, node, error):
        self.received.append(getattr(node, "workeroutput", {}).get("odal_figures") or {})


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker
        session.config.workeroutput["odal_figures"] = run_figures()


def pytest_terminal_summary(terminalreporter, config):
    workers = config.pluginmanager.get_plugin("odal-worker-figures")
    figures = [run_figures(), *(workers.received if workers else [])]
    sent = Counter()
    for measured in figures:
        for key, n in measured.get("fuzz", []):
            sent[tuple(key) if isinstance(key, list) else key] += n
    for line in fuzz_summary(sent) + [line for measured in figures for line in measured.get("restart", [])]:
        terminalreporter.write_line(line)


@pytest.fixture
def fail():
    """A failed attempt written as the sweep writes a batch's failures (mark_attempts_failed_each),
    for one row: whether it took the row."""
    from outbox.models import Delivery, Failure

    def write(delivery, *, token, error, retry_at, at) -> bool:
        failure = Failure(delivery.pk, error, retry_at, at)
        return Delivery.objects.mark_attempts_failed_each(token=token, failures=[failure]) == {delivery.pk}

    return write
