"""What the registry holds of a registration whose register was attempted: the request a
deactivation owed after a suspend sends first (registry.drain, `Registration.finds_first`). A
register whose reply was lost may have landed, so before the row can end as withdrawn (nothing
held) or deactivated, the registry's task list is read, each submission found is checked, and
each the registry granted is deactivated. Only adapter calls: this runs on a drain pool thread."""

from dataclasses import dataclass

from registry import adapters
from registry.models import UNSEARCHABLE, Registration


@dataclass
class Finding:
    """What the registry holds of a registration whose register was attempted: `nothing` (an
    exhaustive lookup found no submission, or the registry rejected what it held), `checking`
    (look again later; `correlation_id` when exactly one), or `deactivated` (a registration it
    granted, deactivated now or already gone: `handle`)."""

    held: str
    said: str
    correlation_id: str = ""
    handle: str = ""


def find_held(adapter, reg: Registration) -> Finding:
    """On a pool thread: the task list (or the request id found before), then a check of each
    submission found, then a deactivation of each the registry granted. A lookup that is not
    proof (unreadable, not exhaustive, a registry that cannot be searched) is Retryable."""
    # The task list on every pass, the request found before (correlation_id) or not: a register
    # whose outcome is unknown may land while that one is still checking, and land as a request
    # of its own once the registry has rejected it; checking only the one found before would end
    # the row on its rejection while the registry holds the other.
    try:
        found = adapter.find_submission(reg.passport.upi)
    except adapters.RegistryUnreadable as exc:
        raise adapters.Retryable(f"the registry's task list could not be read: {exc}") from None
    if isinstance(found, adapters.Found):
        ids = [found.correlation_id]
    elif isinstance(found, adapters.Ambiguous):
        ids = list(found.candidates)
    elif isinstance(found, adapters.Unsupported):
        raise adapters.Retryable(
            f"{UNSEARCHABLE} ({found.why}): what it holds for this passport cannot be found; find it in "
            "the registry's portal and record its handle (Record handle…: the drain then deactivates it), "
            "or publish the passport again to register it afresh"
        )
    elif not found.exhaustive:
        raise adapters.Retryable(f"the registry could not be shown not to hold this passport ({found.why})")
    else:
        ids = []
    remembered = reg.correlation_id if reg.correlation_id and reg.correlation_id not in ids else ""
    if remembered:
        ids.append(remembered)  # found before; a rejection of it shows only in its check
    checking, deactivated, rejected, unknown = [], [], [], ""
    for request_id in ids:
        try:
            answer = adapter.check(request_id)
        except adapters.UnknownRequest:
            if request_id != remembered:
                raise  # the task list names it: the registry contradicts itself
            # The registry (its own 404) no longer knows the request found before: the finding
            # goes on as one that remembers none, on what the task list shows.
            unknown = f"; the registry does not know request {request_id}, found before (HTTP 404)"
            continue
        if answer.status == "registered":
            gone = adapter.deactivate(answer.registration_id)
            deactivated.append(f"{answer.registration_id} ({gone})")
            handle = answer.registration_id
        elif answer.status == "rejected":
            rejected.append(request_id)
        else:
            checking.append(request_id)
    if checking:
        return Finding(
            "checking", f"the registry is still checking {', '.join(checking)}{unknown}",
            correlation_id=checking[0] if len(checking) == 1 else "",
        )  # fmt: skip
    if deactivated:
        return Finding("deactivated", f"deactivated {', '.join(deactivated)}{unknown}", handle=handle)
    if rejected:
        return Finding("nothing", f"the registry rejected what it held ({', '.join(rejected)}){unknown}")
    return Finding("nothing", f"the task list, every page read, holds no submission for this UPI{unknown}")
