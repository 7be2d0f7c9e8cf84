"""Every job a button on its object's page (issue 38, item 1): shown as the list action is offered
(permission and status), the same two-pass page, back to the object with its message; a POST
past the button refused with a message, changing nothing. And no Delete on a published passport."""

import re

import pytest
from django.contrib.auth.models import Group

from odal.core.groups import ensure_groups
from odal.core.models import AuditEntry, Passport
from outbox.models import Consumer, Delivery
from registry.models import Registration
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

pytestmark = pytest.mark.django_db


def buttons(page) -> list[str]:
    """The labels of the buttons of an object's page, in order."""
    bar = re.search(rb'<div class="odal-buttons".*?</div>', page.content, re.S)
    if bar is None:
        return []
    return [label.decode() for label in re.findall(rb"<button [^>]*>([^<]*)</button>", bar.group(0))]


def as_member(client, group: str):
    ensure_groups()
    user = UserFactory()
    user.groups.add(Group.objects.get(name=group))
    client.force_login(user)
    return user


def change_url(obj) -> str:
    return f"/admin/{obj._meta.app_label}/{obj._meta.model_name}/{obj.pk}/change/"


def button_url(obj, action) -> str:
    return f"/admin/{obj._meta.app_label}/{obj._meta.model_name}/{obj.pk}/do/{action}/"


def messages_of(page) -> str:
    return " ".join(m.message for m in page.context["messages"]) if page.context else ""


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: PassportFactory(), ["Publish…"]),
        (lambda: PublishedPassportFactory(), ["Suspend…"]),
        (lambda: PassportFactory(status="suspended"), ["Publish…"]),
        (lambda: backed_off_registration(status="abandoned").passport, ["Publish…", "Suspend…"]),
        (lambda: backed_off_registration(), ["Abandon…"]),
        (lambda: backed_off_registration(status="submitted"), ["Record handle…"]),
        (lambda: backed_off_registration(status="registered"), []),
        (lambda: backed_off_registration(operation="deactivate"), []),
        (lambda: DeadDeliveryFactory(), ["Replay…", "Resend…"]),
        (lambda: DeliveryFactory(status="delivered"), ["Resend…"]),
        (lambda: DeliveryFactory(), []),
        (
            lambda: WebhookConsumerFactory(),
            ["Pause…", "Send a test event", "Rotate the signing secret…", "Remove…"],
        ),
        (lambda: ConsumerFactory(paused=True), ["Resume…", "Send a test event", "Remove…"]),
    ],
)
def test_each_object_page_offers_the_jobs_its_status_allows(admin_client, make, expected):
    page = admin_client.get(change_url(make()))
    assert page.status_code == 200
    assert buttons(page) == expected


def test_a_dead_letter_page_offers_replay_too(admin_client):
    dead = DeadDeliveryFactory()
    assert buttons(admin_client.get(f"/admin/outbox/deadletter/{dead.pk}/change/")) == ["Replay…", "Resend…"]


def test_the_buttons_are_the_list_actions_a_person_may_run(client):
    dead, reg = DeadDeliveryFactory(), backed_off_registration()
    consumer, passport = WebhookConsumerFactory(), PassportFactory()
    as_member(client, "Operators")
    assert buttons(client.get(change_url(dead))) == ["Replay…", "Resend…"]
    assert buttons(client.get(change_url(reg))) == ["Abandon…"]
    assert buttons(client.get(change_url(consumer))) == ["Pause…"]  # (rotate, test, remove: changers)
    assert buttons(client.get(change_url(passport))) == []  # (publish: given by hand)

    as_member(client, "Viewers")
    for obj in (dead, reg, consumer, passport):
        page = client.get(change_url(obj))
        assert page.status_code == 200 and buttons(page) == []


def test_a_dangerous_job_looks_dangerous(admin_client):
    page = admin_client.get(change_url(WebhookConsumerFactory()))
    dangerous = re.findall(rb'<button [^>]*class="odal-button odal-danger[^"]*"[^>]*>([^<]*)<', page.content)
    assert [d.decode() for d in dangerous] == ["Rotate the signing secret…", "Remove…"]
    assert (
        b'class="odal-button odal-danger odal-apart" data-action="rotate_secret"' in page.content
    )  # set apart


def test_a_button_runs_the_two_pass_page_and_comes_back_to_the_object(admin_client):
    dead = DeadDeliveryFactory()
    first = admin_client.post(button_url(dead, "replay_selected"))
    assert first.status_code == 200
    assert b"1 of the 1 selected deliveries are dead and will be replayed" in first.content
    assert f'href="{change_url(dead)}" class="button cancel-link"'.encode() in first.content
    assert f'&rsaquo; <a href="{change_url(dead)}">'.encode() in first.content  # (its breadcrumbs)

    blank = admin_client.post(button_url(dead, "replay_selected"), {"post": "yes", "reason": " "})
    assert b"A reason is required" in blank.content
    assert Delivery.objects.get(pk=dead.pk).status == "dead" and not AuditEntry.objects.exists()

    done = admin_client.post(
        button_url(dead, "replay_selected"), {"post": "yes", "reason": "billing is back"}
    )
    assert done.status_code == 302 and done["Location"] == change_url(dead)
    assert Delivery.objects.get(pk=dead.pk).status == "pending"
    assert AuditEntry.objects.get(action="delivery_replayed").reason == "billing is back"
    assert "Replayed 1 of 1 selected." in messages_of(admin_client.get(change_url(dead)))


def test_the_abandon_page_shows_the_registry_answer_first(admin_client, registry_sim):
    reg = backed_off_registration()
    first = admin_client.post(button_url(reg, "abandon_selected"))
    assert b"holds no submission" in first.content and b"odal-danger" in first.content
    assert Registration.objects.get(pk=reg.pk).status == "pending"
    done = admin_client.post(button_url(reg, "abandon_selected"), {"post": "yes", "reason": "never took it"})
    assert done["Location"] == change_url(reg)
    assert Registration.objects.get(pk=reg.pk).status == "abandoned"


def test_a_job_of_one_pass_and_a_secret(admin_client):
    consumer = WebhookConsumerFactory(name="billing")
    sent = admin_client.post(button_url(consumer, "send_test_event"))
    assert sent.status_code == 302 and sent["Location"] == change_url(consumer)
    assert Delivery.objects.get(consumer=consumer).event.type == "odal.test"

    old = consumer.secret
    shown = admin_client.post(
        button_url(consumer, "rotate_secret"), {"post": "yes", "reason": "leak", "grace": "0s"}
    )
    consumer.refresh_from_db()
    assert consumer.secret != old and consumer.secret.encode() in shown.content
    assert (
        b'data-copy="secret-once"' in shown.content
        and f'href="{change_url(consumer)}"'.encode() in shown.content
    )


def test_remove_goes_back_to_the_list(admin_client):
    consumer = ConsumerFactory()
    gone = admin_client.post(button_url(consumer, "delete_selected"), {"post": "yes", "reason": "retired"})
    assert gone["Location"] == "/admin/outbox/consumer/"
    assert not Consumer.objects.filter(pk=consumer.pk).exists()


@pytest.mark.parametrize(
    "make, action",
    [
        (lambda: DeliveryFactory(status="delivered"), "replay_selected"),
        (lambda: DeliveryFactory(), "resend_selected"),
        (lambda: ConsumerFactory(paused=True), "pause_selected"),
        (lambda: ConsumerFactory(), "resume_selected"),
        (lambda: ConsumerFactory(), "rotate_secret"),  # (a Python consumer)
        (lambda: backed_off_registration(status="registered"), "abandon_selected"),
        (lambda: backed_off_registration(), "record_handle_selected"),
        (lambda: PassportFactory(), "suspend_selected"),
        (lambda: backed_off_registration(status="registered").passport, "publish_selected"),
    ],
)
def test_a_post_past_a_hidden_button_is_refused_with_a_message(admin_client, make, action):
    obj = make()
    before = type(obj).objects.filter(pk=obj.pk).values().get()
    answer = admin_client.post(button_url(obj, action), {"post": "yes", "reason": "forged", "grace": "0s",
                                                         "handle": "reg-1"}, follow=True)  # fmt: skip
    assert answer.redirect_chain == [(change_url(obj), 302)]
    assert "is not open to this" in messages_of(answer) and "Nothing was changed." in messages_of(answer)
    assert type(obj).objects.filter(pk=obj.pk).values().get() == before
    assert not AuditEntry.objects.exists()


def test_a_post_without_the_permission_is_refused_with_a_message(client):
    consumer, dead = ConsumerFactory(), DeadDeliveryFactory()
    as_member(client, "Viewers")
    for obj, action in [(consumer, "pause_selected"), (dead, "replay_selected"), (consumer, "no_such_job")]:
        answer = client.post(button_url(obj, action), {"post": "yes", "reason": "forged"}, follow=True)
        assert answer.redirect_chain == [(change_url(obj), 302)]
        assert "You may not do that" in messages_of(answer)
    assert not Consumer.objects.get(pk=consumer.pk).paused
    assert Delivery.objects.get(pk=dead.pk).status == "dead" and not AuditEntry.objects.exists()

    as_member(client, "Operators")  # may pause, may not rotate (a changer's job)
    client.post(button_url(consumer, "rotate_secret"), {"post": "yes", "reason": "x", "grace": "0s"})
    assert Consumer.objects.get(pk=consumer.pk).secret == consumer.secret


def test_a_button_is_a_form_a_link_only_shows_the_object(admin_client):
    dead = DeadDeliveryFactory()
    answer = admin_client.get(button_url(dead, "replay_selected"))
    assert answer.status_code == 302 and answer["Location"] == change_url(dead)
    assert Delivery.objects.get(pk=dead.pk).status == "dead"


def test_no_delete_on_a_published_passport(admin_client):
    published, draft = PublishedPassportFactory(), PassportFactory()
    assert b"deletelink" not in admin_client.get(change_url(published)).content
    assert b"deletelink" in admin_client.get(change_url(draft)).content

    answer = admin_client.get(f"/admin/odal/passport/{published.pk}/delete/", follow=True)
    assert answer.redirect_chain == [(change_url(published), 302)]
    assert "Not deleted: the passport is published" in messages_of(answer)
    answer = admin_client.post(f"/admin/odal/passport/{published.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 302 and Passport.objects.filter(pk=published.pk).exists()

    admin_client.post(f"/admin/odal/passport/{draft.pk}/delete/", {"post": "yes"})
    assert not Passport.objects.filter(pk=draft.pk).exists()
