"""Issue 41, item 4, in a real Chromium: the admin's main pages run under odal's
Content-Security-Policy without one violation (nothing blocked: no inline script or style, no
other site's source), and every page Chromium loads carries the policy.

What would be blocked is seen three ways: Chromium's console line ("Refused to … because it violates
the following Content Security Policy directive"), the page's own `securitypolicyviolation` events
(recorded from before its first script), and any uncaught error."""

import pytest
from django.contrib import admin

from outbox.models import Consumer, Delivery
from tests.browser.test_admin_in_chromium import a_busy_day, choose_action, log_in
from tests.browser.test_buttons_in_chromium import change_url, superuser
from tests.factories import DeliveryFactory, PassportFactory, PublishedPassportFactory, WebhookConsumerFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Each securitypolicyviolation event, handed to the test as it happens (it survives navigations).
RECORD_VIOLATIONS = """document.addEventListener("securitypolicyviolation", (e) => {
    window.odalViolation(`${e.effectiveDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`);
});"""


@pytest.fixture
def watched(page):
    """The page, and what went wrong on it: CSP's console lines, violations, errors, and the pages
    (documents) whose answer carried no Content-Security-Policy."""
    found = {"console": [], "violations": [], "errors": [], "without policy": []}
    page.expose_function("odalViolation", lambda text: found["violations"].append(f"{page.url}: {text}"))
    page.add_init_script(RECORD_VIOLATIONS)

    def console(message):
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            found["console"].append(f"{page.url}: {message.text}")

    def answered(response):
        if response.request.resource_type == "document" and "content-security-policy" not in response.headers:
            found["without policy"].append(f"{response.status} {response.url}")

    page.on("console", console)
    page.on("pageerror", lambda error: found["errors"].append(f"{page.url}: {error}"))
    page.on("response", answered)
    return page, found


def nothing_wrong(found: dict, visited: list[str]) -> None:
    assert visited, "no page was visited"
    assert {kind: lines for kind, lines in found.items() if lines} == {}, visited


def test_the_admins_main_pages_run_under_the_policy_without_a_violation(watched):
    page, found = watched
    visited = []

    def visit(url: str) -> None:
        page.goto(url)
        page.wait_for_selector("#content, #swagger-ui")
        page.wait_for_load_state("load")
        visited.append(url)

    a_busy_day()  # (deliveries pending: the live pages poll every 3 s)
    draft, published = PassportFactory(), PublishedPassportFactory()
    log_in(page, superuser())  # (the login page itself is the first page watched)
    visited.append("/admin/login/")

    # The dashboard, long enough for live.js to poll and, the work having moved, swap its parts.
    with page.expect_request(lambda r: "/admin/odal/live/dashboard/" in r.url, timeout=15_000):
        visit("/admin/")
    with page.expect_request(lambda r: r.headers.get("x-odal-live") == "1", timeout=15_000):
        DeliveryFactory(consumer=Consumer.objects.get(name="deployer"))
    page.wait_for_timeout(500)

    # Every list of the admin, and the page of its first row (the buttons, the consumer's health,
    # the passport's story).
    for model in admin.site._registry:
        visit(f"/admin/{model._meta.app_label}/{model._meta.model_name}/")
        first = page.locator("#result_list tbody tr:first-child a[href*='/change/']")
        if first.count():
            visit(first.first.get_attribute("href"))
    for obj in (draft, published, Consumer.objects.get(name="deployer")):
        visit(change_url(obj))

    # A live list polled, and a two-pass page that asks a reason.
    with page.expect_request(lambda r: "/admin/odal/live/deliveries/" in r.url, timeout=15_000):
        visit("/admin/outbox/delivery/")
    dead = Delivery.objects.filter(status="dead").order_by("pk").first()
    visit("/admin/outbox/deadletter/")
    choose_action(page, dead.pk, "replay_selected")
    page.wait_for_selector("textarea[name=reason]")
    page.fill("textarea[name=reason]", "billing is back up")
    page.click("input[type=submit].default")
    assert "Replayed 1 of 1 selected." in page.locator(".messagelist").inner_text()
    visited.append("replay's reason form")

    # A button of an object's page, its reason form, and the secret shown once with its copy button.
    visit(change_url(WebhookConsumerFactory(name="billing-hook")))
    page.get_by_role("button", name="Rotate the signing secret…", exact=True).click()
    page.wait_for_selector("textarea[name=reason]")
    page.fill("input[name=grace]", "0s")
    page.fill("textarea[name=reason]", "the old one was pasted in a ticket")
    page.click("input[type=submit].default")
    page.wait_for_selector("#secret-once")
    page.get_by_role("button", name="Copy", exact=True).click()
    visited.append("rotate's reason form and the secret's page")

    # The second factor's enrolment: its QR code is a data: image the policy allows.
    visit("/admin/second-factor/")
    page.wait_for_selector("img.odal-qr")
    assert page.eval_on_selector("img.odal-qr", "img => img.naturalWidth") > 0, "the QR code did not load"

    # The API's own documentation (django-ninja's Swagger UI, served from odal's static files).
    visit("/vault/api/v1/docs")
    page.wait_for_selector(".swagger-ui .info")
    nothing_wrong(found, visited)
    print(f"{len(visited)} pages, no violation")


def test_an_inline_script_is_caught(watched, live_server):
    """The watch bites: a page with an inline script and an inline style, under the policy."""
    page, found = watched
    page.route(
        "**/admin/login/**",
        lambda route: route.fulfill(
            response=route.fetch(),
            body='<html><body><p style="color:red">x</p><script>document.title = "ran"</script></body></html>',
        ),
    )
    page.goto("/admin/login/")
    page.wait_for_timeout(300)
    assert page.title() != "ran"
    assert any("script-src" in line for line in found["violations"]), found
    assert any("Content Security Policy" in line for line in found["console"]), found
