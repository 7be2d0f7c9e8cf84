"""The registry simulator's late landing (issue 22): a register answered only after its client
gave up (or with its connection dropped), which the registry stores landing_delay seconds after
it arrived, as behind a gateway that passes a request on late. Through the http adapter over
real HTTP. Where a test needs the landing at a moment of its own it sets a delay it cannot reach
and lands it by hand (land_pending), so nothing hangs on the machine's speed."""

import httpx
import pytest
from django.conf import settings

from registry import adapters
from tests.factories import RegistrationFactory
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db

NEVER = 600  # seconds: a landing_delay no test reaches; land_pending() lands it


@pytest.fixture
def adapter(registry_sim):
    registry = adapters.HttpRegistry(settings.ODAL_REGISTRY_URL, settings.ODAL_REGISTRY_TOKEN, timeout=1)
    yield registry
    registry.close()


def held(sim, upi) -> list[str]:
    return sorted(r["requestId"] for r in sim.requests.values() if r["upi"] == upi)


def gives_up(adapter, reg) -> str:
    """register(reg), which the simulator holds past the client's timeout: what the client says
    (an outcome unknown: the request may have reached the registry)."""
    with pytest.raises(adapters.OutcomeUnknown) as caught:
        adapter.register(reg)
    return str(caught.value)


def test_a_late_register_is_not_held_when_its_client_gives_up_and_is_once_it_lands(registry_sim, adapter):
    registry_sim.faults.update(late_landing=1, landing_delay=NEVER)
    reg = RegistrationFactory()
    upi = reg.passport.upi

    assert gives_up(adapter, reg).startswith("registry timed out after 1s")
    assert adapter.find_submission(upi) == adapters.NotFound(exhaustive=True)
    assert registry_sim.landing(upi) == 1

    assert registry_sim.land_pending() == 1
    [request_id] = held(registry_sim, upi)
    assert adapter.find_submission(upi) == adapters.Found(request_id)
    assert [(x["upi"], x["status"], x["requestId"]) for x in registry_sim.landings] == [
        (upi, 202, request_id)
    ]
    assert registry_sim.landing(upi) == 0


def test_a_late_register_lands_by_itself_landing_delay_after_it_arrived(registry_sim, adapter):
    registry_sim.faults.update(late_landing=1, landing_delay=1.5)
    reg = RegistrationFactory()

    assert gives_up(adapter, reg).startswith("registry timed out after 1s")
    assert wait_for(lambda: registry_sim.landings, 30)
    [landing] = registry_sim.landings
    assert landing["status"] == 202 and landing["afterSeconds"] >= 1.5
    assert held(registry_sim, reg.passport.upi) == [landing["requestId"]]
    assert registry_sim.late_upis == set()  # late_landing counts calls; it marks no UPI


def test_a_client_that_waits_longer_than_the_landing_hears_the_gateways_504(registry_sim):
    registry_sim.faults.update(late_landing=1, landing_delay=0.2)
    patient = adapters.HttpRegistry(settings.ODAL_REGISTRY_URL, settings.ODAL_REGISTRY_TOKEN, timeout=30)
    reg = RegistrationFactory()
    try:
        with pytest.raises(adapters.OutcomeUnknown, match="registry answered HTTP 504"):
            patient.register(reg)
    finally:
        patient.close()
    [landing] = registry_sim.landings
    assert held(registry_sim, reg.passport.upi) == [landing["requestId"]]


def test_late_landing_reset_breaks_the_connection_at_once_and_still_lands(registry_sim):
    registry_sim.faults.update(late_landing=1, landing_delay=NEVER, late_landing_reset=True)
    patient = adapters.HttpRegistry(settings.ODAL_REGISTRY_URL, settings.ODAL_REGISTRY_TOKEN, timeout=30)
    reg = RegistrationFactory()
    try:
        with pytest.raises(adapters.OutcomeUnknown) as caught:
            patient.register(reg)  # a timeout would take 30 s and say so
    finally:
        patient.close()
    assert str(caught.value).startswith("registry connection broke after the request was sent"), caught.value
    assert held(registry_sim, reg.passport.upi) == []
    assert registry_sim.land_pending() == 1
    assert len(held(registry_sim, reg.passport.upi)) == 1


@pytest.mark.parametrize("honour_idempotency_key", [False, True])
def test_a_retry_while_the_late_register_is_on_its_way_is_the_request_held(
    registry_sim, adapter, honour_idempotency_key
):
    """The retry (the same Idempotency-Key: the registration's id) finds nothing held and is
    accepted; the late one then lands on it as any later register would, DUPLICATE_UPI (or, with
    honour_idempotency_key, the retry's own request), and stores nothing: one request, the one
    the client knows."""
    registry_sim.faults.update(
        late_landing=1, landing_delay=NEVER, honour_idempotency_key=honour_idempotency_key
    )
    reg = RegistrationFactory()
    gives_up(adapter, reg)

    retry = adapter.register(reg)
    assert isinstance(retry, adapters.Accepted)
    registry_sim.land_pending()

    assert held(registry_sim, reg.passport.upi) == [retry.request_id]
    [landing] = registry_sim.landings
    assert (landing["status"], landing["requestId"]) == (
        202 if honour_idempotency_key else 409,
        retry.request_id,
    )
    again = adapter.register(reg)
    assert again == (adapters.Accepted if honour_idempotency_key else adapters.Duplicate)(retry.request_id)


@pytest.mark.parametrize("honour_idempotency_key", [False, True])
def test_a_retry_after_the_late_register_landed_meets_it(registry_sim, adapter, honour_idempotency_key):
    registry_sim.faults.update(
        late_landing=1, landing_delay=NEVER, honour_idempotency_key=honour_idempotency_key
    )
    reg = RegistrationFactory()
    gives_up(adapter, reg)
    registry_sim.land_pending()
    [landed] = held(registry_sim, reg.passport.upi)

    retry = adapter.register(reg)
    assert retry == (adapters.Accepted if honour_idempotency_key else adapters.Duplicate)(landed)
    assert held(registry_sim, reg.passport.upi) == [landed]


def test_a_late_register_lands_though_the_registry_refused_the_upi_meanwhile(registry_sim, adapter):
    """refuse_upi_containing (like register_5xx and lost_reply) is the registry unavailable when a
    request arrives: the late one got through, later, so it lands; the retries are refused."""
    registry_sim.faults.update(late_landing=1, landing_delay=NEVER, refuse_upi_containing="REFUSE")
    reg = RegistrationFactory(passport__upi="https://id.example.eu/01/1/21/REFUSE-late")
    gives_up(adapter, reg)
    with pytest.raises(adapters.Retryable, match="registry answered HTTP 503"):
        adapter.register(reg)
    assert held(registry_sim, reg.passport.upi) == []

    registry_sim.land_pending()
    assert len(held(registry_sim, reg.passport.upi)) == 1


def test_a_late_register_the_registry_rejects_stores_nothing_when_it_lands(registry_sim, adapter):
    registry_sim.faults.update(late_landing=1, landing_delay=NEVER, reject_upi_containing="BAD")
    reg = RegistrationFactory(passport__upi="https://id.example.eu/01/1/21/BAD-late")
    gives_up(adapter, reg)
    registry_sim.land_pending()
    assert [x["status"] for x in registry_sim.landings] == [422]
    assert held(registry_sim, reg.passport.upi) == []


def test_late_landing_upi_containing_takes_the_first_register_of_each_such_upi(registry_sim, adapter):
    registry_sim.faults.update(late_landing_upi_containing="LANDS-LATE", landing_delay=NEVER)
    marked = RegistrationFactory(passport__upi="https://id.example.eu/01/1/21/LANDS-LATE-1")
    other = RegistrationFactory(passport__upi="https://id.example.eu/01/1/21/ON-TIME-1")

    gives_up(adapter, marked)
    assert isinstance(adapter.register(marked), adapters.Accepted)  # its second register: on time
    assert isinstance(adapter.register(other), adapters.Accepted)
    assert registry_sim.landing() == 1 and registry_sim.late_upis == {marked.passport.upi}


def test_a_reset_forgets_the_late_registers_on_their_way(registry_sim, adapter):
    """The tests share one simulator (registry_sim resets it): a register late in one test never
    lands in the next."""
    registry_sim.faults.update(late_landing=1, landing_delay=NEVER)
    reg = RegistrationFactory()
    gives_up(adapter, reg)
    [late] = registry_sim.late

    registry_sim.reset()
    assert late.woken.is_set()  # its thread stops waiting...
    assert registry_sim.land(late) is False  # ...and lands nothing
    assert registry_sim.landing() == 0 and registry_sim.land_pending() == 0
    assert registry_sim.requests == {} and registry_sim.landings == []


@pytest.mark.parametrize(
    "faults",
    [{"late_landing": -1}, {"late_landing": 1.5}, {"late_landing": True}, {"landing_delay": "soon"},
     {"landing_delay": -1}, {"landing_delay": 3601}, {"late_landing_reset": 1},
     {"late_landing_upi_containing": 7}],
)  # fmt: skip
def test_the_simulator_refuses_a_late_landing_fault_it_cannot_use(registry_sim, faults):
    answer = httpx.post(f"{settings.ODAL_REGISTRY_URL}/_faults", json=faults)
    assert answer.status_code == 422 and answer.json()["code"] == "UNKNOWN_FAULT"
    assert registry_sim.faults["late_landing"] == 0 and registry_sim.faults["landing_delay"] == 15.0


def test_the_simulator_takes_the_late_landing_faults_at_run_time(registry_sim):
    faults = {"late_landing": 2, "landing_delay": 2.5, "late_landing_reset": True,
              "late_landing_upi_containing": "LANDS-LATE"}  # fmt: skip
    answer = httpx.post(f"{settings.ODAL_REGISTRY_URL}/_faults", json=faults)
    assert answer.status_code == 200
    assert {name: registry_sim.faults[name] for name in faults} == faults
