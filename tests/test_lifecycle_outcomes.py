"""What publishing a published passport answers, read from what the registry work did (issue 40:
the enum, not the sentence)."""

import pytest

from odal.core.models import AuditEntry
from odal.surfaces import lifecycle
from tests.factories import RegistrationFactory


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields, changed",
    [
        ({"status": "rejected"}, True),  # queued afresh
        ({"status": "pending", "operation": "deactivate", "handle": "reg-1"}, True),  # deactivation cancelled
        ({"status": "registered", "handle": "reg-1"}, False),  # left as it is
    ],
    ids=["queued", "cancelled", "left"],
)
def test_publishing_a_published_passport_changes_something_only_when_registry_work_was_queued_or_cancelled(
    fields, changed
):
    reg = RegistrationFactory(**fields)

    result = lifecycle.publish(reg.passport_id, actor="test")

    assert result.changed is changed
    assert AuditEntry.objects.filter(action="registry_requeued").exists() is changed
    assert ("nothing changed" in result.detail) is not changed
