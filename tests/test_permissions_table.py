"""Who may do what, as one table: every API route and every admin action, against anonymous, each
token scope and each kind of staff (the Operators and Viewers groups the migrations create, a staff
user with no permission at all, a superuser).

The routes come from the API's own OpenAPI document and the actions from each registered
ModelAdmin's get_actions, and both must match the tables exactly: a new route or action fails here
until someone decides who may use it. One request per cell.

A cell is 401 (who are you?), 403 (not you) or ok (anything but 401/403: the request got past the
permission gate; a 404 or 422 for the made-up ids and empty bodies is fine). In the admin there is no
401: anonymous callers and API tokens (the admin ignores bearer tokens) are sent to the login page,
which the table writes as 401; 403 is the admin's PermissionDenied, or an action not offered, so it
never runs.
"""

import functools
import re
import uuid

import pytest
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import models
from django.test import Client, RequestFactory

from odal.core.auth import ScopedAuth
from odal.surfaces.api import api
from tests.factories import issue_token

pytestmark = pytest.mark.django_db

WHO = ["anonymous", "read", "write", "admin", "Operators", "Viewers", "staff", "superuser"]

# fmt: off
API = {
    #                                              anon read  write admin Oper. View. staff super
    ("POST", "dpp"):                               "401  403  ok    ok    403   403   403   ok",
    ("POST", "dpp/bulk"):                          "401  403  ok    ok    403   403   403   ok",
    ("GET", "dpp"):                                "401  ok   ok    ok    ok    ok    403   ok",
    ("GET", "dpp/{dppId}"):                        "401  ok   ok    ok    ok    ok    403   ok",
    ("GET", "events/{eventId}"):                   "401  ok   ok    ok    ok    ok    403   ok",
    ("POST", "dpp/{dppId}/publish"):               "401  403  ok    ok    403   403   403   ok",
    ("POST", "dpp/{dppId}/suspend"):               "401  403  ok    ok    403   403   403   ok",
    ("GET", "dpp/{dppId}/registry"):               "401  ok   ok    ok    ok    ok    403   ok",
    ("POST", "dpp/{dppId}/registry/abandon"):      "401  403  403   ok    ok    403   403   ok",
    ("POST", "dpp/{dppId}/registry/handle"):       "401  403  403   ok    ok    403   403   ok",
    ("GET", "registry"):                           "401  ok   ok    ok    ok    ok    403   ok",
    ("POST", "events"):                            "401  403  ok    ok    403   403   403   ok",
    ("POST", "outbox/consumers"):                  "401  403  403   ok    403   403   403   ok",
    ("GET", "outbox"):                             "401  ok   ok    ok    ok    ok    403   ok",
    ("GET", "outbox/deliveries"):                  "401  ok   ok    ok    ok    ok    403   ok",
    ("GET", "outbox/deliveries/{deliveryId}"):     "401  ok   ok    ok    ok    ok    403   ok",
    ("POST", "outbox/deliveries/{deliveryId}/replay"): "401  403  403   ok    ok    403   403   ok",
    ("POST", "outbox/replay"):                     "401  403  403   ok    ok    403   403   ok",
    ("GET", "outbox/consumers"):                   "401  ok   ok    ok    ok    ok    403   ok",
    ("GET", "outbox/consumers/{name}"):            "401  ok   ok    ok    ok    ok    403   ok",
    ("PATCH", "outbox/consumers/{name}"):          "401  403  403   ok    403   403   403   ok",
    ("DELETE", "outbox/consumers/{name}"):         "401  403  403   ok    403   403   403   ok",
    ("POST", "outbox/consumers/{name}/pause"):     "401  403  403   ok    ok    403   403   ok",
    ("POST", "outbox/consumers/{name}/resume"):    "401  403  403   ok    ok    403   403   ok",
    ("POST", "outbox/consumers/{name}/rotate-secret"): "401  403  403   ok    403   403   403   ok",
    ("POST", "outbox/consumers/{name}/test-event"): "401  403  403   ok    403   403   403   ok",
    ("POST", "outbox/deliveries/{deliveryId}/resend"): "401  403  403   ok    ok    403   403   ok",
    ("POST", "outbox/resend"):                     "401  403  403   ok    ok    403   403   ok",
}

ADMIN = {
    #                                                  anon read  write admin Oper. View. staff super
    ("auth.group", "delete_selected"):                 "401  401  401   401   403   403   403   ok",
    ("auth.user", "delete_selected"):                  "401  401  401   401   403   403   403   ok",
    ("django_q.schedule", "delete_selected"):          "401  401  401   401   403   403   403   ok",
    ("django_q.success", "delete_selected"):           "401  401  401   401   403   403   403   ok",
    ("django_q.success", "resubmit_task"):             "401  401  401   401   403   403   403   ok",
    ("django_q.failure", "delete_selected"):           "401  401  401   401   403   403   403   ok",
    ("django_q.failure", "resubmit_task"):             "401  401  401   401   403   403   403   ok",
    ("django_q.ormq", "delete_selected"):              "401  401  401   401   403   403   403   ok",
    ("odal.passport", "delete_selected"):              "401  401  401   401   403   403   403   ok",
    ("odal.passport", "publish_selected"):             "401  401  401   401   403   403   403   ok",
    ("odal.passport", "suspend_selected"):             "401  401  401   401   403   403   403   ok",
    ("odal.apitoken", "revoke_selected"):              "401  401  401   401   403   403   403   ok",
    ("outbox.consumer", "delete_selected"):            "401  401  401   401   403   403   403   ok",
    ("outbox.consumer", "pause_selected"):             "401  401  401   401   ok    403   403   ok",
    ("outbox.consumer", "resume_selected"):            "401  401  401   401   ok    403   403   ok",
    ("outbox.consumer", "rotate_secret"):              "401  401  401   401   403   403   403   ok",
    ("outbox.consumer", "send_test_event"):            "401  401  401   401   403   403   403   ok",
    ("outbox.delivery", "replay_selected"):            "401  401  401   401   ok    403   403   ok",
    ("outbox.delivery", "resend_selected"):            "401  401  401   401   ok    403   403   ok",
    ("outbox.deadletter", "replay_selected"):          "401  401  401   401   ok    403   403   ok",
    ("outbox.deadletter", "resend_selected"):          "401  401  401   401   ok    403   403   ok",
    ("registry.registration", "abandon_selected"):     "401  401  401   401   ok    403   403   ok",
    ("registry.registration", "record_handle_selected"): "401  401  401   401   ok    403   403   ok",
    ("registry.stalledregistration", "abandon_selected"): "401  401  401   401   ok    403   403   ok",
    ("registry.stalledregistration", "record_handle_selected"): "401  401  401   401   ok    403   403   ok",
}
# fmt: on

PREFIX = "/vault/api/v1/"


def cells(table):
    for key, row in table.items():
        expected = row.split()
        assert len(expected) == len(WHO), f"{key}: {len(expected)} cells for {len(WHO)} callers"
        yield from ((key, who, want) for who, want in zip(WHO, expected, strict=True))


def cell_id(key, who):
    return f"{' '.join(key)} as {who}"


def api_operations():
    for path, methods in api.get_openapi_schema()["paths"].items():
        assert path.startswith(PREFIX), path
        for method in methods:
            yield method.upper(), path.removeprefix(PREFIX)


def admin_actions():
    request = RequestFactory().get("/admin/")
    request.user = get_user_model()(is_staff=True, is_superuser=True)  # offered every action there is
    for model, model_admin in admin.site._registry.items():
        for name in model_admin.get_actions(request):
            yield model._meta.label_lower, name


def test_the_api_table_covers_every_route():
    assert set(api_operations()) == set(API)


def test_the_admin_table_covers_every_action():
    assert set(admin_actions()) == set(ADMIN)


def test_every_route_declares_a_scope_and_a_permission_that_exists():
    for _prefix, router in api._routers:
        for path, view in router.path_operations.items():
            for operation in view.operations:
                auths = [a for a in operation.auth_callbacks if isinstance(a, ScopedAuth)]
                assert len(auths) == 1 and len(operation.auth_callbacks) == 1, path
                app_label, codename = auths[0].perm.split(".")
                assert Permission.objects.filter(
                    content_type__app_label=app_label, codename=codename
                ).exists(), f"{path}: no permission {auths[0].perm}"


def staff_user(**fields):
    # No password (UserFactory hashes one, a third of a second per user).
    return get_user_model().objects.create(username=f"staff-{uuid.uuid4().hex[:8]}", is_staff=True, **fields)


def client_for(who: str) -> Client:
    client = Client()
    if who in ("read", "write", "admin"):
        client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {issue_token(who)}"
    elif who == "superuser":
        client.force_login(staff_user(is_superuser=True))
    elif who == "staff":
        client.force_login(staff_user())
    elif who != "anonymous":
        user = staff_user()
        user.groups.add(Group.objects.get(name=who))
        client.force_login(user)
    return client


API_CELLS = list(cells(API))


@pytest.mark.parametrize("key, who, want", API_CELLS, ids=[cell_id(k, w) for k, w, _ in API_CELLS])
def test_api(key, who, want):
    method, path = key
    url = PREFIX + re.sub(r"\{\w+\}", lambda _: str(uuid.uuid4()), path)
    client = client_for(who)
    response = client.generic(method, url, "{}", content_type="application/json")
    got = str(response.status_code) if response.status_code in (401, 403) else "ok"
    assert got == want, f"{method} {path} as {who}: {response.status_code} {response.content[:300]!r}"
    if got == "403":
        code = response.json()["code"]
        assert code == ("insufficient_scope" if who in ("read", "write") else "insufficient_permission")


def a_made_up_pk(model):
    pk = model._meta.pk
    if isinstance(pk, models.UUIDField):
        return str(uuid.uuid4())
    if isinstance(pk, models.CharField):
        return "0" * min(pk.max_length or 32, 32)
    return "987654321"


ADMIN_CELLS = list(cells(ADMIN))


@pytest.mark.parametrize("key, who, want", ADMIN_CELLS, ids=[cell_id(k, w) for k, w, _ in ADMIN_CELLS])
def test_admin_action(monkeypatch, key, who, want):
    label, action = key
    model = next(m for m in admin.site._registry if m._meta.label_lower == label)
    model_admin = admin.site._registry[model]
    ran = []

    # The action's function, as get_actions offers it, records that it was called: the permission
    # filtering of get_actions itself is untouched.
    def spying_get_actions(request, real=model_admin.get_actions):
        def spy(func):
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                ran.append(func.__name__)
                return func(*args, **kwargs)

            return wrapper

        return {name: (spy(func), name_, desc) for name, (func, name_, desc) in real(request).items()}

    monkeypatch.setattr(model_admin, "get_actions", spying_get_actions)
    url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
    data = {"action": action, "index": "0", helpers.ACTION_CHECKBOX_NAME: [a_made_up_pk(model)]}
    response = client_for(who).post(url, data)
    if response.status_code == 302 and response["Location"].startswith("/admin/login/"):
        got = "401"
    elif response.status_code in (401, 403) or not ran:
        got = "403"
    else:
        got = "ok"
    assert got == want, f"{label} {action} as {who}: {response.status_code}, ran {ran}"
