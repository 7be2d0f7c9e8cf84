"""Numbers in a JSON body (issue 37, item 7): each comes back as it was sent, or is refused with a
422 naming its field; never "not valid JSON" for the whole request, never changed on the way.

PostgreSQL's jsonb keeps a number as `numeric`: it has no negative zero (`-0.0` came back `0.0`),
and it writes a number out in full, so a float of 1e16 or more came back as an integer (`1e308`
as 309 digits). Python reads an integer of at most 4,300 digits (`sys.get_int_max_str_digits`):
one more made the whole bulk request "not valid JSON". The safer answer is a refusal: a passport's
data is a record others rely on, and a refusal at the one boundary tells the sender which field
at once, where a number changed in storage is found late, if ever (docs/runbook.md)."""

import io
import json
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from odal.core.models import Passport
from outbox.models import Event

pytestmark = pytest.mark.django_db

UPI = "https://id.example.eu/01/09506000134352/21/NUM-{}"
LIMIT = sys.get_int_max_str_digits()  # 4,300 unless the environment says otherwise
LONG = "7" * (LIMIT + 1)


def item(n: int, data: str = "{}") -> str:
    """A passport as JSON text, its `data` written by hand (what json.dumps would not write)."""
    return '{"upi": "' + UPI.format(n) + '", "operatorId": "OP-1", "data": ' + data + "}"


def test_an_integer_longer_than_python_reads_fails_its_bulk_item_alone(api_as):
    body = '{"items": [' + ", ".join([item(1), item(2, '{"x": ' + LONG + "}"), item(3)]) + "]}"
    response = api_as("write").post("dpp/bulk", body)
    assert response.status_code == 200, response.content[:300]
    first, bad, last = response.json()["results"]
    assert first["id"] and last["id"] and "id" not in bad
    assert bad["error"]["code"] == "invalid_request"
    assert bad["error"]["errors"] == [
        {
            "field": "data.x",
            "message": f"is an integer of {LIMIT + 1:,} digits, more than the {LIMIT:,} odal reads",
        }
    ]
    assert set(Passport.objects.values_list("upi", flat=True)) == {UPI.format(1), UPI.format(3)}


def test_an_integer_longer_than_python_reads_elsewhere_is_422_naming_its_field(admin_api):
    response = admin_api.post("events", '{"type": "passport.published", "payload": {"n": -' + LONG + "}}")
    assert response.status_code == 422, response.content[:300]
    assert response.json()["code"] == "invalid_request"
    assert response.json()["errors"][0]["field"] == "payload.n"
    assert not Event.objects.exists()


REFUSED = {
    "1e308": ("1e308", "is the number 1e308, which would be stored as an integer of 309 digits"),
    "1.5E16": ("1.5E16", "is the number 1.5E16, which would be stored as an integer of 17 digits"),
    "-1e20": ("-1e20", "is the number -1e20, which would be stored as an integer of 21 digits"),
    "-0.0": ("-0.0", "is negative zero, which would be stored as 0"),
    "-0": ("-0", "is negative zero, which would be stored as 0"),
    "-0e5": ("-0e5", "is negative zero, which would be stored as 0"),
    "1e-400": ("1e-400", "is the number 1e-400, which is too small to store"),
    "-2.5e-999": ("-2.5e-999", "is the number -2.5e-999, which is too small to store"),
}


@pytest.mark.parametrize("number, problem", REFUSED.values(), ids=REFUSED.keys())
def test_a_number_storage_would_change_is_refused_naming_its_field(api_as, number, problem):
    api = api_as("write")
    response = api.post("dpp", item(1, '{"kept": 1, "n": ' + number + "}"))
    assert response.status_code == 422, response.content[:300]
    assert response.json()["code"] == "invalid_request"
    [error] = response.json()["errors"]
    assert error["field"] == "data.n" and error["message"].startswith(problem)
    assert not Passport.objects.exists()
    # In a bulk item, that item alone.
    out = api.post("dpp/bulk", '{"items": [' + item(2, '{"n": ' + number + "}") + ", " + item(3) + "]}")
    bad, good = out.json()["results"]
    assert bad["error"]["errors"][0]["field"] == "data.n" and good["id"]


KEPT = [
    "0", "-1", "0.0", "0e-400", "1.5", "-2.25", "1e-7", "5e-324", "1E2", "100.0", "9999999999999998.0",
    "9007199254740993", "123456789012345678901234567890", "-" + "9" * LIMIT, "[1, 2.0, -3]",
]  # fmt: skip


@pytest.mark.parametrize("number", KEPT, ids=lambda n: n[:20])
def test_every_number_taken_comes_back_as_it_was_sent(api_as, number):
    api = api_as("write")
    sent = json.loads(number)
    made = api.post("dpp", item(1, '{"n": ' + number + "}"))
    assert made.status_code == 201, made.content[:300]
    for answer in (made, api.get(f"dpp/{made.json()['id']}")):
        back = answer.json()["data"]["n"]
        assert back == sent and type(back) is type(sent), (number, back)
        if isinstance(sent, list):
            assert [type(x) for x in back] == [type(x) for x in sent]
    event = api_as("admin").post("events", '{"type": "t.x", "payload": {"n": ' + number + "}}")
    assert event.status_code == 201, event.content[:300]
    stored = Event.objects.get().payload["n"]
    assert stored == sent and type(stored) is type(sent)


def test_the_import_refuses_the_same_numbers_line_by_line(tmp_path):
    path = tmp_path / "numbers.jsonl"
    path.write_text(
        "\n".join([item(1), item(2, '{"x": ' + LONG + "}"), item(3, '{"x": 1e308}'), item(4)]) + "\n"
    )
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("passport", "import", str(path), stdout=io.StringIO(), stderr=err)
    problems = dict(text.split(": ", 1) for text in err.getvalue().splitlines())
    assert problems["line 2"].startswith(
        f"This passport is not valid. data.x: is an integer of {LIMIT + 1:,} digits"
    )
    assert problems["line 3"].startswith("This passport is not valid. data.x: is the number 1e308")
    assert set(Passport.objects.values_list("upi", flat=True)) == {UPI.format(1), UPI.format(4)}


@pytest.mark.parametrize(
    "number, shown",
    [
        ("1e308", "data.n is the number 1e308, which would be stored as an integer of 309 digits"),
        ("-0.0", "data.n is negative zero"),
        ("NaN", "data.n is NaN"),
        (LONG, f"data.n is an integer of {LIMIT + 1:,} digits"),
    ],
    ids=["1e308", "-0.0", "NaN", "long integer"],
)
def test_the_admin_form_refuses_the_same_numbers(admin_client, number, shown):
    form = {"upi": UPI.format(1), "operator_id": "OP-1", "facility_id": "", "commodity_code": ""}
    response = admin_client.post("/admin/odal/passport/add/", {**form, "data": '{"n": ' + number + "}"})
    assert response.status_code == 200
    assert shown in response.content.decode()
    assert not Passport.objects.exists()
