"""Issue 38's admin, attacked (a hostile staff member, a hostile peer): what broke, pinned."""

import pytest
from django.contrib import admin as django_admin
from django.test import RequestFactory

from odal.models import AuditEntry, Passport
from tests.factories import PassportFactory, PublishedPassportFactory, UserFactory
from tests.test_buttons import messages_of

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("status", ["published", "suspended"])
def test_a_published_passport_is_never_deleted_from_the_list(admin_client, settings, status):
    """With ODAL_REGISTRY_ADAPTER=none no registration protects a published passport: Django's
    delete_selected deleted it ("Successfully deleted 1 passport.")."""
    settings.ODAL_REGISTRY_ADAPTER = "none"
    passport, draft = PassportFactory(status=status), PassportFactory()
    selected = {"action": "delete_selected", "_selected_action": [str(passport.pk), str(draft.pk)]}
    for form in (selected, {**selected, "post": "yes"}):  # the first pass, and a forged second
        answer = admin_client.post("/admin/odal/passport/", form, follow=True)
        assert answer.status_code == 200
        assert "has been published" in messages_of(answer) and "Nothing was deleted" in messages_of(answer)
        assert passport.upi in messages_of(answer)
    assert Passport.objects.filter(pk__in=[passport.pk, draft.pk]).count() == 2
    assert not AuditEntry.objects.filter(action="passport_deleted").exists()
    # Drafts alone are deleted as before.
    admin_client.post(
        "/admin/odal/passport/",
        {"action": "delete_selected", "_selected_action": [str(draft.pk)], "post": "yes"},
    )
    assert not Passport.objects.filter(pk=draft.pk).exists()


def test_a_passport_published_after_the_confirmation_page_is_not_deleted(settings):
    """The confirmation page (list or object) showed a draft; it was published before the POST
    that confirms (no registration with adapter none): the delete itself, under the row's lock,
    refuses it (delete_queryset and delete_model are what Django calls on that POST)."""
    from odal.admin import PublishedNotDeleted

    settings.ODAL_REGISTRY_ADAPTER = "none"
    passport = PublishedPassportFactory()
    model_admin = django_admin.site._registry[Passport]
    request = RequestFactory().post("/admin/odal/passport/")
    request.user = UserFactory(is_staff=True, is_superuser=True)
    for delete in (
        lambda: model_admin.delete_queryset(request, Passport.objects.filter(pk=passport.pk)),
        lambda: model_admin.delete_model(request, passport),
    ):
        with pytest.raises(PublishedNotDeleted):
            delete()
        assert Passport.objects.filter(pk=passport.pk).exists()
