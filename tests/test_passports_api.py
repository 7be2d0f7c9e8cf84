import uuid

import pytest

from odal.core.models import AuditEntry, Passport
from tests.factories import PassportFactory, PublishedPassportFactory

pytestmark = pytest.mark.django_db

GOOD = {"upi": "https://id.example.eu/01/09506000134352/21/ABC", "operatorId": "OP-9"}


def test_create_passport_is_a_draft(api_as):
    response = api_as("write").post("dpp", {**GOOD, "facilityId": "F-1", "data": {"mass": 3}})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "draft"
    passport = Passport.objects.get(pk=body["id"])
    assert passport.upi == GOOD["upi"]
    assert passport.data == {"mass": 3}
    assert AuditEntry.objects.filter(action="passport_created", object_id=str(passport.pk)).count() == 1


def test_get_passport(api_as):
    passport = PassportFactory()
    response = api_as("read").get(f"dpp/{passport.pk}")
    assert response.status_code == 200
    assert response.json()["upi"] == passport.upi


def test_duplicate_upi_is_409_and_writes_nothing(api_as):
    PassportFactory(upi=GOOD["upi"])
    response = api_as("write").post("dpp", GOOD)
    assert response.status_code == 409
    assert response.json()["code"] == "upi_taken"
    assert Passport.objects.count() == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({**GOOD, "upi": "http://id.example.eu/01/1"}, "upi"),
        ({**GOOD, "upi": "not a url"}, "upi"),
        ({**GOOD, "upi": "https://id.example.eu/" + "x" * 2000}, "upi"),
        ({**GOOD, "operatorId": "   "}, "operatorId"),
        ({**GOOD, "operatorId": 12}, "operatorId"),
        ({**GOOD, "data": [1, 2]}, "data"),
        ({"operatorId": "OP"}, "upi"),
    ],
)
def test_bad_passport_input_is_422_with_a_sentence(api_as, body, field):
    response = api_as("write").post("dpp", body)
    assert response.status_code == 422, response.content
    payload = response.json()
    assert payload["code"] == "invalid_request"
    assert field in payload["detail"] and payload["detail"].endswith(".")
    assert Passport.objects.count() == 0


def test_malformed_json_is_4xx_not_500(api_as):
    client = api_as("write")
    response = client.client.post(
        "/vault/api/v1/dpp", "{not json", content_type="application/json", headers=client.headers
    )
    assert 400 <= response.status_code < 500
    assert "detail" in response.json()


def test_non_uuid_id_is_422(api_as):
    response = api_as("read").get("dpp/not-a-uuid")
    assert response.status_code == 422
    assert "dppId" in response.json()["detail"]


def test_unknown_passport_is_404(api_as):
    response = api_as("read").get(f"dpp/{uuid.uuid4()}")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_oversized_body_is_413(api_as, settings):
    body = {**GOOD, "data": {"blob": "x" * (settings.ODAL_MAX_BODY_BYTES + 10)}}
    response = api_as("write").post("dpp", body)
    assert response.status_code == 413
    assert response.json()["code"] == "body_too_large"
    assert Passport.objects.count() == 0


def test_publish_then_suspend_audits_each_change(api_as):
    passport = PassportFactory()
    client = api_as("write")
    published = client.post(f"dpp/{passport.pk}/publish")
    assert published.status_code == 200
    assert published.json()["status"] == "published" and published.json()["changed"] is True
    again = client.post(f"dpp/{passport.pk}/publish")
    assert again.json()["changed"] is False
    suspended = client.post(f"dpp/{passport.pk}/suspend")
    assert suspended.json()["status"] == "suspended"
    actions = list(
        AuditEntry.objects.filter(object_id=str(passport.pk)).order_by("id").values_list("action", "actor")
    )
    assert actions == [("passport_published", "token:test-write"), ("passport_suspended", "token:test-write")]


def test_suspending_a_draft_is_409(api_as):
    passport = PassportFactory()
    response = api_as("write").post(f"dpp/{passport.pk}/suspend")
    assert response.status_code == 409
    assert response.json()["code"] == "passport_is_draft"
    passport.refresh_from_db()
    assert passport.status == "draft"
    assert not AuditEntry.objects.exists()


def test_suspended_passport_can_be_published_again(api_as):
    passport = PassportFactory(status=Passport.Status.SUSPENDED)
    response = api_as("write").post(f"dpp/{passport.pk}/publish")
    assert response.json()["status"] == "published"


def test_publish_of_unknown_passport_is_404(api_as):
    assert api_as("write").post(f"dpp/{uuid.uuid4()}/publish").status_code == 404


def test_openapi_and_docs_are_served(client):
    assert client.get("/vault/api/v1/openapi.json").status_code == 200
    assert client.get("/vault/api/v1/docs").status_code == 200


def test_published_passport_factory_matches_model():
    assert PublishedPassportFactory().status == "published"
