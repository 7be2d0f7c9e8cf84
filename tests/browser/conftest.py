"""Real-browser tests: Playwright driving Debian's Chromium against pytest-django's live server.

Skipped, saying so, when Chromium is not installed (`apt-get install chromium`; .ci/run does it).
"""

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ODAL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
HAVE_CHROMIUM = Path(CHROMIUM).exists()
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
SKIP_REASON = (
    f"Chromium not found at {CHROMIUM}: install it (apt-get install chromium) to run the browser tests"
)

# Playwright's sync API keeps an event loop in this thread; the ORM calls the tests make between
# browser steps are still plain synchronous code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/browser/" in str(item.fspath).replace(os.sep, "/"):
            if not HAVE_CHROMIUM:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
            item.add_marker(pytest.mark.slow)  # seconds each, a Chromium's start the first


def pytest_report_header(config):
    return f"browser tests: {'Chromium at ' + CHROMIUM if HAVE_CHROMIUM else 'SKIPPED — ' + SKIP_REASON}"


def pytest_terminal_summary(terminalreporter):
    if not HAVE_CHROMIUM:
        terminalreporter.write_line(f"NOTE: the browser tests were skipped. {SKIP_REASON}.", yellow=True)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
            ],
        )  # fmt: skip
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=live_server.url)
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture
def screenshot(tmp_path):
    """Photographs a page: into docs/screenshots (README's pictures) with ODAL_SCREENSHOTS=docs set,
    else into the test's own temporary folder, so that a test run leaves the checkout as it was."""
    folder = SCREENSHOTS if os.environ.get("ODAL_SCREENSHOTS") == "docs" else tmp_path

    def take(page, name: str) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
