"""Issue 41, item 2, in a real Chromium: a superuser in production is taken to the enrolment page
after the password, sets up the authenticator from the secret shown, is shown the recovery codes,
and at the next sign-in is asked for a code; axe-core finds no serious violation on these pages.

With ODAL_SHOTS=<folder> set, the enrolment, recovery-codes and code pages are photographed there
at 1366 and 390 px wide (docs/screenshots/admin/2fa-*.png)."""

from base64 import b32decode

import pytest
from django_otp.oath import totp

from tests.browser.test_admin_in_chromium import log_in
from tests.browser.test_buttons_in_chromium import no_serious_violations, photograph, superuser

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_superuser_enrols_and_signs_in_with_a_code(page, settings):
    settings.PRODUCTION = True
    user = superuser()
    log_in(page, user)
    assert "/admin/second-factor/" in page.url
    assert page.locator("img.odal-qr").evaluate("img => img.complete && img.naturalWidth > 0")
    no_serious_violations(page)
    photograph(page, "2fa-enrol")
    key = b32decode(page.input_value("#otp-secret").replace(" ", ""))
    page.fill("#id_code", "000000" if f"{totp(key):06d}" != "000000" else "111111")
    page.click("input[type=submit]")
    assert "That code is not right" in page.inner_text(".errorlist")
    page.fill("#id_code", f"{totp(key):06d}")
    page.click("input[type=submit]")
    assert len(page.input_value("#secret-once").split()) == 10
    no_serious_violations(page)
    photograph(page, "2fa-recovery-codes")
    page.click("text=I have copied them")
    page.wait_for_selector("#content-main")
    assert page.url.endswith("/admin/")

    page.click("#logout-form button")
    log_in(page, user)
    assert "/admin/second-factor/code/" in page.url
    no_serious_violations(page)
    photograph(page, "2fa-code")
    page.fill("#id_code", f"{totp(key, drift=1):06d}")
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")
    assert page.url.endswith("/admin/")
