import pytest
from django.contrib.admin import helpers
from django.contrib.auth.models import Permission

from odal.core.models import AuditEntry
from registry.models import Registration
from tests.factories import UserFactory, backed_off_registration

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/registry/registration/"


def login_with(client, *codenames):
    user = UserFactory()
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_registration", *codenames]))
    client.force_login(user)
    return user


def act(client, action, regs, **extra):
    data = {"action": action, helpers.ACTION_CHECKBOX_NAME: [str(r.pk) for r in regs], **extra}
    return client.post(CHANGELIST, data, follow="post" in extra)


def test_abandon_shows_the_registry_answer_then_needs_a_reason(client, registry_sim):
    user = login_with(client, "abandon_registration")
    reg = backed_off_registration()
    registry_sim.hold("https://other.example.eu/x", "req-held")
    held = backed_off_registration(passport__upi="https://other.example.eu/x")

    page = act(client, "abandon_selected", [reg, held])
    assert b"holds no submission" in page.content and b"can be abandoned" in page.content
    assert b"req-held" in page.content  # what the registry answered for the other one
    assert Registration.objects.filter(status="abandoned").count() == 0

    blank = act(client, "abandon_selected", [reg, held], post="yes", reason="")
    assert b"A reason is required" in blank.content
    assert not AuditEntry.objects.exists()

    done = act(client, "abandon_selected", [reg, held], post="yes", reason="registry keeps refusing")
    assert b"Abandoned 1 of 2 selected. The passports stay published" in done.content
    assert b"Not abandoned" in done.content
    assert Registration.objects.get(pk=reg.pk).status == "abandoned"
    assert Registration.objects.get(pk=held.pk).status == "pending"
    assert AuditEntry.objects.get().actor == f"user:{user.username}"


def test_record_handle_action(client):
    login_with(client, "record_handle")
    reg = backed_off_registration(status="submitted", correlation_id="req-1")
    page = act(client, "record_handle_selected", [reg])
    assert b'name="handle"' in page.content and b'name="reason"' in page.content
    act(client, "record_handle_selected", [reg], post="yes", handle="reg-9", reason="read off the portal")
    reg.refresh_from_db()
    assert (reg.status, reg.handle) == ("registered", "reg-9")


def test_actions_need_their_permissions(client, registry_sim):
    login_with(client)
    reg = backed_off_registration()
    page = client.get(CHANGELIST)
    assert page.status_code == 200
    assert b"abandon_selected" not in page.content and b"record_handle_selected" not in page.content
    act(client, "abandon_selected", [reg], post="yes", reason="sneaky")
    assert Registration.objects.get(pk=reg.pk).status == "pending"
    assert registry_sim.calls == []


def test_registration_page_shows_the_registry_answers(admin_client, registry_sim):
    from odal.surfaces import lifecycle
    from registry.drain import drain_once
    from tests.factories import PassportFactory

    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    drain_once()
    reg = Registration.objects.get()
    page = admin_client.get(f"/admin/registry/registration/{reg.pk}/change/")
    assert page.status_code == 200 and reg.correlation_id.encode() in page.content
