"""The audit trail's page reads every app's objects: their names (name_objects) and its search
(audit_search). Moved out of odal.core.record, which the apps' admins use."""

import uuid

from django.db.models import Q

from odal.core.admin import distinct_values
from odal.core.models import ApiToken, AuditEntry, Passport
from odal.core.upi import canonical_upi
from outbox.models import Consumer, Delivery
from registry.models import Registration


def name_objects(entries) -> None:
    """Give each entry of a page of the trail `object_name`: its object named as staff know it
    (a consumer's name, a passport's UPI), one indexed query per kind of object on the page."""
    ids: dict[str, set] = {}
    for entry in entries:
        ids.setdefault(entry.object_type, set()).add(entry.object_id)

    def keys(kind, as_uuid):
        found = []
        for value in ids.get(kind, ()):
            try:
                found.append(uuid.UUID(value) if as_uuid else int(value))
            except ValueError:
                pass
        return found

    names = {}
    for pk, upi in Passport.objects.filter(pk__in=keys("odal.passport", True)).values_list("pk", "upi"):
        names["odal.passport", str(pk)] = upi
    for pk, name in Consumer.objects.filter(pk__in=keys("outbox.consumer", False)).values_list("pk", "name"):
        names["outbox.consumer", str(pk)] = name
    for pk, name in ApiToken.objects.filter(pk__in=keys("odal.apitoken", False)).values_list("pk", "name"):
        names["odal.apitoken", str(pk)] = name
    for pk, upi in Registration.objects.filter(pk__in=keys("registry.registration", True)).values_list(
        "pk", "passport__upi"
    ):
        names["registry.registration", str(pk)] = f"of {upi}"
    for pk, kind, consumer in Delivery.objects.filter(pk__in=keys("outbox.delivery", True)).values_list(
        "pk", "event_type", "consumer__name"
    ):
        names["outbox.delivery", str(pk)] = f"{kind} → {consumer}"
    for entry in entries:
        entry.object_name = names.get((entry.object_type, entry.object_id))


def audit_search(term: str):
    """What the trail's search box finds for `term`, each by an index at any size of the trail:
    entries about the object of that id; about a passport of that UPI, or its registration;
    about the consumers whose name holds it; and by the actors whose name holds it (the
    distinct actors found by hopping through audit_actor_idx). No LIKE over the trail."""
    ids = {term}
    upis = {term}
    try:
        upis.add(canonical_upi(term))
    except ValueError:
        pass
    passports = [str(pk) for pk in Passport.objects.filter(upi__in=upis).values_list("pk", flat=True)]
    ids.update(passports)
    if passports:
        ids.update(
            str(pk)
            for pk in Registration.objects.filter(passport_id__in=passports).values_list("pk", flat=True)
        )
    found = Q(object_id__in=ids)
    consumers = [str(pk) for pk in Consumer.objects.filter(name__icontains=term).values_list("pk", flat=True)]
    if consumers:
        found |= Q(object_type="outbox.consumer", object_id__in=consumers)
    actors = [actor for actor in distinct_values(AuditEntry, "actor") if term.casefold() in actor.casefold()]
    if actors:
        found |= Q(actor__in=actors)
    return found


# -- internals for superusers -----------------------------------------------------------------
