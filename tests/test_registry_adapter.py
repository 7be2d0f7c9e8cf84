"""The http adapter against the simulator over real HTTP: find_submission's rules."""

import pytest
from django.conf import settings

from registry import adapters


@pytest.fixture
def adapter(registry_sim):
    registry = adapters.HttpRegistry(settings.ODAL_REGISTRY_URL, settings.ODAL_REGISTRY_TOKEN, timeout=2)
    yield registry
    registry.close()


UPI = "https://id.example.eu/01/1/21/X"


def fill(sim, n):
    for i in range(n):
        sim.hold(f"https://other.example.eu/{i}", f"req-{i}", status="registered")


def test_every_page_is_read_before_saying_not_found(registry_sim, adapter):
    registry_sim.faults["page_size"] = 2
    fill(registry_sim, 5)
    assert adapter.find_submission(UPI) == adapters.NotFound(exhaustive=True)
    registry_sim.hold(UPI, "req-last")  # on the last page
    assert adapter.find_submission(UPI) == adapters.Found("req-last")
    pages = [c for c in registry_sim.calls if c == ("GET", "/dpp-registration-requests")]
    assert len(pages) == 3 + 3


def test_rejected_requests_do_not_count(registry_sim, adapter):
    registry_sim.hold(UPI, "req-r", status="rejected")
    assert adapter.find_submission(UPI) == adapters.NotFound(exhaustive=True)


def test_two_held_requests_are_ambiguous(registry_sim, adapter):
    registry_sim.hold(UPI, "req-a")
    registry_sim.hold(UPI, "req-b", status="registered")
    assert adapter.find_submission(UPI) == adapters.Ambiguous(["req-a", "req-b"])


def test_an_unread_task_makes_the_answer_not_exhaustive(registry_sim, adapter):
    registry_sim.faults["partial_task_list"] = True
    answer = adapter.find_submission(UPI)
    assert isinstance(answer, adapters.NotFound) and answer.exhaustive is False


def test_an_unsearchable_registry_is_unsupported(registry_sim, adapter):
    registry_sim.faults["unsearchable"] = True
    assert isinstance(adapter.find_submission(UPI), adapters.Unsupported)


def test_a_failing_later_page_makes_it_unreadable(registry_sim, adapter):
    registry_sim.faults.update(page_size=1, task_list_5xx=True)
    fill(registry_sim, 2)
    with pytest.raises(adapters.RegistryUnreadable, match="503"):
        adapter.find_submission(UPI)


def test_a_wrong_token_is_not_mistaken_for_absence(registry_sim):
    registry = adapters.HttpRegistry(settings.ODAL_REGISTRY_URL, "wrong", timeout=2)
    with pytest.raises(adapters.RegistryUnreadable, match="401"):
        registry.find_submission(UPI)


def test_register_maps_every_answer(registry_sim, adapter, db):
    from tests.factories import RegistrationFactory

    reg = RegistrationFactory(passport__upi=UPI)
    assert isinstance(adapter.register(reg), adapters.Accepted)
    assert isinstance(adapter.register(reg), adapters.Duplicate)
    registry_sim.faults["register_5xx"] = 1
    with pytest.raises(adapters.Retryable, match="503"):
        adapter.register(reg)
    registry_sim.faults["reject_upi_containing"] = "/X"
    registry_sim.requests.clear()
    assert adapter.register(reg) == adapters.Rejected(f"VALIDATION_FAILED: upi {UPI} fails validation")


def test_deactivating_an_unknown_registration_is_already_gone(registry_sim, adapter):
    assert adapter.deactivate("reg-nope") == "already gone"
