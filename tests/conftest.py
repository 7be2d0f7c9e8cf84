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


@pytest.fixture
def api_as():
    def make(scope: str | None = "admin") -> ApiClient:
        return ApiClient(issue_token(scope) if scope else None)

    return make


@pytest.fixture
def admin_api(api_as):
    return api_as("admin")
