"""Every job a button on its object's page, in a real Chromium (issue 38, items 1, 6 and 7): each
button shown where the status and the person allow it, its two-pass page, back on the object with
its message; no Delete on a published passport; the copy button of a secret; the favicon; and
axe-core on every page these touch (no serious or critical violation).

With ODAL_SHOTS=<folder> set, the object pages and the two-pass pages are also photographed there
at 1366 and 390 px wide."""

import os
from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe

from odal.core.models import AuditEntry, Passport
from outbox.models import Consumer, Delivery
from registry.models import Registration
from tests.browser.test_admin_in_chromium import log_in, person
from tests.factories import (
    ConsumerFactory,
    DeadDeliveryFactory,
    DeliveryFactory,
    PassportFactory,
    PublishedPassportFactory,
    UserFactory,
    WebhookConsumerFactory,
    backed_off_registration,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = os.environ.get("ODAL_SHOTS")
AXE = Axe()


def superuser():
    return UserFactory(username="admin-lead", is_superuser=True, is_staff=True)


def change_url(obj) -> str:
    return f"/admin/{obj._meta.app_label}/{obj._meta.model_name}/{obj.pk}/change/"


def button_labels(page) -> list[str]:
    return page.locator(".odal-buttons button").all_inner_texts()


def no_serious_violations(page) -> None:
    """axe-core's rules on the page as it stands (labels, names, focus order, colour contrast…):
    none violated with a serious or critical impact."""
    found = AXE.run(page).response["violations"]
    serious = [
        f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:5]}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]
    assert serious == [], page.url


def photograph(page, name: str) -> None:
    if not SHOTS:
        return
    folder = Path(SHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    for width, height in ((1366, 768), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.screenshot(path=str(folder / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


def test_each_page_shows_the_jobs_its_status_and_its_reader_allow(page):
    draft, published = PassportFactory(), PublishedPassportFactory()
    owed, submitted = backed_off_registration(), backed_off_registration(status="submitted")
    dead, delivered, pending = DeadDeliveryFactory(), DeliveryFactory(status="delivered"), DeliveryFactory()
    running, paused = WebhookConsumerFactory(name="billing"), ConsumerFactory(name="deployer", paused=True)
    log_in(page, superuser())
    for obj, expected in [
        (draft, ["Publish…"]),
        (published, ["Suspend…"]),
        (owed, ["Abandon…"]),
        (submitted, ["Record handle…"]),
        (dead, ["Replay…", "Resend…"]),
        (delivered, ["Resend…"]),
        (pending, []),
        (running, ["Pause…", "Send a test event", "Rotate the signing secret…", "Remove…"]),
        (paused, ["Resume…", "Send a test event", "Remove…"]),
    ]:
        page.goto(change_url(obj))
        assert button_labels(page) == expected, change_url(obj)
        dangerous = page.locator(".odal-buttons button.odal-danger").all_inner_texts()
        assert dangerous == [
            label
            for label in expected
            if label in ("Suspend…", "Abandon…", "Rotate the signing secret…", "Remove…")
        ]
        if expected:
            no_serious_violations(page)
    page.goto(change_url(running))
    photograph(page, "consumer")

    page.context.clear_cookies()
    log_in(page, person("Operators"))
    for obj, expected in [(published, []), (owed, ["Abandon…"]), (dead, ["Replay…", "Resend…"]),
                          (running, ["Pause…"])]:  # fmt: skip
        page.goto(change_url(obj))
        assert button_labels(page) == expected
    page.context.clear_cookies()
    log_in(page, person("Viewers"))
    for obj in (draft, owed, submitted, dead, running, paused):
        page.goto(change_url(obj))
        page.wait_for_selector("#content-main")
        assert button_labels(page) == []


# (label, how to make the object, what else the form asks, the message it ends with, the check)
TWO_PASS = {
    "publish": (
        "Publish…", lambda: PassportFactory(upi="https://id.example.eu/01/09506000134352/21/BAT-0042"), {},
        "Published 1 of 1 selected.", lambda obj: Passport.objects.get(pk=obj.pk).status == "published",
    ),
    "suspend": (
        "Suspend…", lambda: PublishedPassportFactory(upi="https://id.example.eu/01/09506000134352/21/BAT-0043"),
        {}, "Suspended 1 of 1 selected.", lambda obj: Passport.objects.get(pk=obj.pk).status == "suspended",
    ),
    "abandon": (
        "Abandon…", lambda: backed_off_registration(attempts=6), {}, "Abandoned 1 of 1 selected.",
        lambda obj: Registration.objects.get(pk=obj.pk).status == "abandoned",
    ),
    "record_handle": (
        "Record handle…", lambda: backed_off_registration(status="submitted", correlation_id="req-77"),
        {"input[name=handle]": "reg-2026-0042"}, "Recorded handle reg-2026-0042",
        lambda obj: Registration.objects.get(pk=obj.pk).handle == "reg-2026-0042",
    ),
    "replay": (
        "Replay…", lambda: DeadDeliveryFactory(consumer=ConsumerFactory(name="billing")), {},
        "Replayed 1 of 1 selected.", lambda obj: Delivery.objects.get(pk=obj.pk).status == "pending",
    ),
    "resend": (
        "Resend…", lambda: DeliveryFactory(consumer=ConsumerFactory(name="billing"), status="delivered"), {},
        "Resent 1 of 1 selected.", lambda obj: Delivery.objects.get(pk=obj.pk).status == "pending",
    ),
    "pause": (
        "Pause…", lambda: WebhookConsumerFactory(name="billing"), {}, "Paused: billing.",
        lambda obj: Consumer.objects.get(pk=obj.pk).paused,
    ),
    "resume": (
        "Resume…", lambda: ConsumerFactory(name="billing", paused=True), {}, "Resumed: billing.",
        lambda obj: not Consumer.objects.get(pk=obj.pk).paused,
    ),
    "remove": (
        "Remove…", lambda: ConsumerFactory(name="retired"), {}, "Removed 1 of 1 selected: retired.",
        lambda obj: not Consumer.objects.filter(pk=obj.pk).exists(),
    ),
}  # fmt: skip
OPTIONAL_REASON = {"publish", "suspend"}


@pytest.mark.parametrize("job", TWO_PASS)
def test_a_button_leads_to_its_two_pass_page_and_back(page, registry_sim, job):
    label, make, more, said, done = TWO_PASS[job]
    obj = make()
    log_in(page, superuser())
    page.goto(change_url(obj))
    page.get_by_role("button", name=label, exact=True).click()
    page.wait_for_selector("textarea[name=reason]")
    if job == "abandon":
        assert "holds no submission" in page.locator("#content-main").inner_text()  # asked first
    assert page.locator(".cancel-link").get_attribute("href") == change_url(obj)
    danger = "odal-danger" in (page.locator("input[type=submit].default").get_attribute("class") or "")
    assert danger == (job in ("suspend", "abandon", "remove"))
    no_serious_violations(page)
    photograph(page, f"{job}-first-pass")

    if job not in OPTIONAL_REASON:
        for selector, value in more.items():
            page.fill(selector, value)
        page.click("input[type=submit].default")  # no reason yet
        assert "A reason is required" in page.locator(".errorlist").inner_text()
        assert not done(obj) and not AuditEntry.objects.exclude(action="passport_created").exists()
        no_serious_violations(page)
        photograph(page, f"{job}-blank-reason")

    for selector, value in more.items():
        page.fill(selector, value)
    page.fill("textarea[name=reason]", f"{job} from its page")
    page.click("input[type=submit].default")
    page.wait_for_selector(".messagelist")
    assert said in page.locator(".messagelist").inner_text()
    assert done(obj)
    expected = "/admin/outbox/consumer/" if job == "remove" else change_url(obj)
    assert page.url.endswith(expected)
    assert AuditEntry.objects.filter(reason=f"{job} from its page").exists() or job in OPTIONAL_REASON
    photograph(page, f"{job}-done")


def test_send_a_test_event_from_the_consumer_page(page):
    consumer = WebhookConsumerFactory(name="billing")
    log_in(page, superuser())
    page.goto(change_url(consumer))
    page.get_by_role("button", name="Send a test event", exact=True).click()
    assert "Test event sent to billing" in page.locator(".messagelist").inner_text()
    assert page.url.endswith(change_url(consumer))
    assert Delivery.objects.get(consumer=consumer).event.type == "odal.test"


def test_rotate_from_the_consumer_page_and_copy_the_secret(browser, live_server):
    consumer = WebhookConsumerFactory(name="billing")
    old = consumer.secret
    context = browser.new_context(
        viewport={"width": 1280, "height": 900}, base_url=live_server.url,
        permissions=["clipboard-read", "clipboard-write"],
    )  # fmt: skip
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        log_in(page, superuser())
        page.goto(change_url(consumer))
        page.get_by_role("button", name="Rotate the signing secret…", exact=True).click()
        page.wait_for_selector("textarea[name=reason]")
        assert "odal-danger" in page.locator("input[type=submit].default").get_attribute("class")
        page.fill("input[name=grace]", "0s")
        page.fill("textarea[name=reason]", "the old one was pasted in a ticket")
        page.click("input[type=submit].default")
        page.wait_for_selector("#secret-once")
        consumer.refresh_from_db()
        assert consumer.secret != old and page.locator("#secret-once").input_value() == consumer.secret

        page.evaluate("navigator.clipboard.writeText('nothing yet')")
        page.get_by_role("button", name="Copy", exact=True).click()
        page.wait_for_function("document.getElementById('secret-copied').textContent === 'Copied.'")
        assert page.evaluate("navigator.clipboard.readText()") == consumer.secret
        no_serious_violations(page)
        photograph(page, "rotate-secret-shown")

        page.click("text=I have copied it: back to the consumer")
        assert page.url.endswith(change_url(consumer))
    finally:
        context.close()


def test_no_delete_on_a_published_passport(page):
    published = PublishedPassportFactory()
    draft = PassportFactory()
    log_in(page, superuser())
    page.goto(change_url(draft))
    assert page.locator("a.deletelink").count() == 1
    page.goto(change_url(published))
    page.wait_for_selector(".odal-buttons")
    assert page.locator("a.deletelink").count() == 0
    photograph(page, "passport-published")

    page.goto(f"/admin/odal/passport/{published.pk}/delete/")  # (an old bookmark, a typed URL)
    assert page.url.endswith(change_url(published))
    assert "Not deleted: the passport is published" in page.locator(".messagelist").inner_text()
    assert Passport.objects.filter(pk=published.pk).exists()


def test_every_admin_page_links_a_favicon_that_is_served(page):
    log_in(page, superuser())
    for url in ("/admin/", "/admin/odal/passport/"):
        page.goto(url)
        href = page.locator("link[rel=icon]").get_attribute("href")
        answer = page.request.get(href)
        assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml")
        assert b"<svg" in answer.body()
    page.context.clear_cookies()
    page.goto("/admin/login/")
    assert page.locator("link[rel=icon]").count() == 1


def test_the_other_object_pages_read_well(page):
    """A draft passport, a stalled registration, a dead delivery: their buttons, and nothing axe-core
    calls serious (photographed when ODAL_SHOTS is set)."""
    log_in(page, superuser())
    reg = backed_off_registration(
        attempts=6, passport__upi="https://id.example.eu/01/09506000134352/21/BAT-0099"
    )
    dead = DeadDeliveryFactory(
        consumer=ConsumerFactory(name="billing"), last_error="HTTP 503: billing is down"
    )
    for name, obj, labels in [
        ("passport-draft", PassportFactory(), ["Publish…"]),
        ("registration", reg, ["Abandon…"]),
        ("delivery-dead", dead, ["Replay…", "Resend…"]),
    ]:
        page.goto(change_url(obj))
        assert button_labels(page) == labels
        no_serious_violations(page)
        photograph(page, name)


def test_the_buttons_read_in_the_dark_theme(browser, live_server):
    """Django's admin follows the system's dark theme: the buttons' contrast holds there too."""
    consumer = WebhookConsumerFactory(name="billing")
    context = browser.new_context(viewport={"width": 1366, "height": 768}, base_url=live_server.url,
                                  color_scheme="dark")  # fmt: skip
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        log_in(page, superuser())
        page.goto(change_url(consumer))
        assert page.evaluate("matchMedia('(prefers-color-scheme: dark)').matches")
        remove = page.get_by_role("button", name="Remove…", exact=True)
        assert remove.evaluate("b => getComputedStyle(b).color") == "rgb(255, 138, 128)"  # #ff8a80
        no_serious_violations(page)
        photograph(page, "consumer-dark")
    finally:
        context.close()
