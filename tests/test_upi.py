"""One product, one passport (issue 17, item 2): a UPI is stored in its canonical form, the same
through the API, the command line and the admin, unique on that form; the migration rewrites the
UPIs stored before and names, without merging them, passports whose UPIs collide."""

import io
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from odal.core.models import AuditEntry, Passport
from odal.core.upi import canonical_upi, upi_key
from tests.factories import PassportFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_the_upi_rule_imports_nothing_above_it():
    """odal.core.upi sits under the input rules, and they under the admin's reason forms
    (odal.core.admin_actions -> odal.core.reasons -> odal.core.rules -> odal.core.upi): importing
    the rules, in a fresh interpreter, loads neither the admin's modules nor anything of odal but
    what they stand on."""
    code = "import sys, odal.core.rules; print(sorted(m for m in sys.modules if m.startswith('odal')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['odal', 'odal.core', 'odal.core.rules', 'odal.core.text', 'odal.core.upi']"


CANONICAL = "https://id.example.eu/01/09506000134352/21/ABC"
# the four spellings of one product
FOUR_SPELLINGS = [
    CANONICAL,
    "https://ID.EXAMPLE.EU/01/09506000134352/21/ABC",
    "HTTPS://id.example.eu/01/09506000134352/21/ABC",
    "https://id.example.eu:443/01/09506000134352/21/ABC",
]


# -- the one function ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling, canonical",
    [
        *[(spelling, CANONICAL) for spelling in FOUR_SPELLINGS],
        ("  HTTPS://Id.Example.EU:0443/01/09506000134352/21/ABC  ", CANONICAL),
        ("https://id.example.eu/%30%31/09506000134352/21/%41BC", CANONICAL),  # unreserved: decoded
        ("https://id.example.eu/01/a%2fb%c3%bc", "https://id.example.eu/01/a%2Fb%C3%BC"),  # others: upper hex
        ("https://id.example.eu/01/ü", "https://id.example.eu/01/%C3%BC"),
        ("https://id.example.eu/01/a?x=%7e1#%7E", "https://id.example.eu/01/a?x=~1#~"),
        ("https://id.example.eu", "https://id.example.eu/"),
        ("https://id.example.eu:8443/01/A", "https://id.example.eu:8443/01/A"),
        ("https://BÜCHER.example/01/A", "https://xn--bcher-kva.example/01/A"),
        ("https://id.example.eu/01/abc", "https://id.example.eu/01/abc"),  # the path keeps its case
    ],
)
def test_canonical_upi(spelling, canonical):
    assert canonical_upi(spelling) == canonical
    assert canonical_upi(canonical) == canonical  # canonical forms are fixed points


@pytest.mark.parametrize(
    "value, says",
    [
        ("http://id.example.eu/01/1", "must be an https URL"),
        ("ftp://id.example.eu/01/1", "must be an https URL"),
        ("not a url", "must be an https URL"),
        ("https://id.example.eu:99999/01/1", "must be an https URL"),
        ("https://id.example.eu/01/50%", "has a % that does not start an escape"),
        ("https://id.example.eu/01/\x7f", "must not contain control characters"),
        ("https://id.example.eu/" + "x" * 2000, "must be at most 2000 characters"),
        ("https://id.example.eu/" + "ü" * 400, "must be at most 2000 characters in its canonical form"),
        (12, "must be a string"),
    ],
)
def test_canonical_upi_refuses_with_a_reason(value, says):
    with pytest.raises(ValueError, match=says):
        canonical_upi(value)


def test_upi_key_compares_spellings_and_leaves_what_is_not_a_upi_as_it_is():
    assert len({upi_key(spelling) for spelling in FOUR_SPELLINGS}) == 1
    assert upi_key("http://id.example.eu/x") == "http://id.example.eu/x"
    assert upi_key(CANONICAL.lower()) != upi_key(CANONICAL)


# -- every surface stores the canonical form -----------------------------------------------------------


def test_the_four_spellings_make_one_passport_through_the_api(api_as):
    client = api_as("write")
    first = client.post("dpp", {"upi": FOUR_SPELLINGS[1], "operatorId": "OP-1"})
    assert first.status_code == 201, first.content
    assert first.json()["upi"] == CANONICAL
    for spelling in [FOUR_SPELLINGS[0], *FOUR_SPELLINGS[2:]]:
        response = client.post("dpp", {"upi": spelling, "operatorId": "OP-1"})
        assert response.status_code == 409, (spelling, response.content)
        assert response.json()["code"] == "upi_taken"
    assert list(Passport.objects.values_list("upi", flat=True)) == [CANONICAL]


def test_the_api_refuses_a_malformed_escape_with_a_sentence(api_as):
    response = api_as("write").post("dpp", {"upi": "https://id.example.eu/01/50%", "operatorId": "OP-1"})
    assert response.status_code == 422
    assert response.json()["detail"] == (
        "The request is not valid. upi: has a % that does not start an escape such as %2F "
        "(write a % sign as %25)."
    )


def run_passport(*args) -> str:
    out = io.StringIO()
    call_command("passport", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_command_line_stores_the_canonical_form():
    out = run_passport("create", "--upi", FOUR_SPELLINGS[3], "--operator", "OP-1")
    assert out.endswith(f"for {CANONICAL}\n")
    with pytest.raises(CommandError, match="already exists"):
        run_passport("create", "--upi", FOUR_SPELLINGS[2], "--operator", "OP-1")
    assert list(Passport.objects.values_list("upi", flat=True)) == [CANONICAL]


def admin_add(client, upi: str):
    return client.post(
        "/admin/odal/passport/add/",
        {"upi": upi, "operator_id": "OP-1", "facility_id": "", "commodity_code": "", "data": "{}"},
    )


def test_the_admin_stores_the_canonical_form_and_refuses_what_the_api_refuses(client):
    client.force_login(UserFactory(is_superuser=True))
    assert admin_add(client, FOUR_SPELLINGS[1]).status_code == 302
    assert list(Passport.objects.values_list("upi", flat=True)) == [CANONICAL]

    again = admin_add(client, FOUR_SPELLINGS[3])
    assert again.status_code == 200 and b"already exists" in again.content
    for upi in ("http://id.example.eu/01/1", "ftp://id.example.eu/01/1"):
        refused = admin_add(client, upi)
        assert refused.status_code == 200 and b"The UPI must be an https URL" in refused.content
    assert Passport.objects.count() == 1


# -- the UPIs stored before -----------------------------------------------------------------------------


def stored(upi: str) -> Passport:
    """A passport as an earlier version stored it: the UPI as typed."""
    passport = PassportFactory()
    Passport.objects.filter(pk=passport.pk).update(upi=upi)
    return passport


def upi_of(passport) -> str:
    return Passport.objects.values_list("upi", flat=True).get(pk=passport.pk)


def test_the_migration_canonicalises_stored_upis_and_reports_collisions_unmerged(capsys):
    executor = MigrationExecutor(connection)
    executor.migrate([("odal", "0003_operator_and_viewer_groups")])
    alone = stored("https://ID.example.eu:443/01/1")
    fine = stored("https://id.example.eu/01/2")
    held = stored("https://id.example.eu/01/3")  # already canonical, and another spelling of it
    other_spelling = stored("HTTPS://id.example.eu/01/3")
    twin_a, twin_b = stored("https://ID.example.eu/01/4"), stored("https://id.example.eu:443/01/4")
    legacy = stored("http://id.example.eu/01/5")

    executor = MigrationExecutor(connection)
    executor.migrate([("odal", "0004_canonical_upis")])

    assert upi_of(alone) == "https://id.example.eu/01/1"
    assert upi_of(fine) == "https://id.example.eu/01/2"
    for passport, upi in [
        (held, "https://id.example.eu/01/3"),
        (other_spelling, "HTTPS://id.example.eu/01/3"),
        (twin_a, "https://ID.example.eu/01/4"),
        (twin_b, "https://id.example.eu:443/01/4"),
        (legacy, "http://id.example.eu/01/5"),
    ]:
        assert upi_of(passport) == upi  # left as they were
    entry = AuditEntry.objects.get(action="passport_upi_canonicalised")
    assert (entry.actor, entry.object_id) == ("system", str(alone.pk))
    assert entry.details == {"from": "https://ID.example.eu:443/01/1", "to": "https://id.example.eu/01/1"}
    out = capsys.readouterr().out
    assert "1 passport UPI(s) rewritten in canonical form." in out
    assert f"{alone.pk}: https://ID.example.eu:443/01/1 -> https://id.example.eu/01/1" in out
    assert "2 UPI(s) are held by more than one passport once spelt canonically" in out
    for passport in (held, other_spelling, twin_a, twin_b):
        assert f"passport {passport.pk} (draft): {upi_of(passport)}" in out
    assert f"passport {legacy.pk}: 'http://id.example.eu/01/5' must be an https URL" in out


def test_the_command_finishes_once_a_person_resolved_a_collision():
    """The runbook's way: decide which passport is the product's, delete (or suspend) the others,
    then `odal passport canonicalise`."""
    twin_a, twin_b = stored("https://ID.example.eu/01/4"), stored("https://id.example.eu:443/01/4")
    with pytest.raises(CommandError, match="Some passports were left unchanged") as refused:
        run_passport("canonicalise")
    assert refused.value.returncode == 1
    assert {upi_of(twin_a), upi_of(twin_b)} == {
        "https://ID.example.eu/01/4",
        "https://id.example.eu:443/01/4",
    }

    twin_b.delete()
    out = run_passport("canonicalise")
    assert "1 passport UPI(s) rewritten in canonical form." in out
    assert upi_of(twin_a) == "https://id.example.eu/01/4"
    assert "0 passport UPI(s) rewritten" in run_passport("canonicalise")
