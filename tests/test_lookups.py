"""`field__any=[…]` (odal.core.lookups): one array parameter on PostgreSQL, the same rows as `__in`."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from outbox.models import Consumer, Delivery
from tests.factories import ConsumerFactory, DeliveryFactory


@pytest.mark.django_db
def test_any_takes_the_rows_in_takes_with_one_parameter_whatever_the_count():
    rows = [DeliveryFactory() for _ in range(3)]
    wanted = [rows[0].pk, rows[2].pk, uuid.uuid4()]  # (one that matches nothing)

    with CaptureQueriesContext(connection) as queries:
        found = set(Delivery.objects.filter(pk__any=wanted).values_list("pk", flat=True))

    assert (
        found
        == set(Delivery.objects.filter(pk__in=wanted).values_list("pk", flat=True))
        == {rows[0].pk, rows[2].pk}
    )
    assert "= ANY(" in queries[0]["sql"] and " IN (" not in queries[0]["sql"]


@pytest.mark.django_db
def test_any_prepares_each_value_as_its_field_does():
    rows = [DeliveryFactory() for _ in range(2)]
    consumers = [ConsumerFactory(), ConsumerFactory()]

    assert set(Delivery.objects.filter(pk__any=[str(rows[1].pk), None]).values_list("pk", flat=True)) == {
        rows[1].pk
    }
    assert set(Delivery.objects.filter(pk__any=[rows[0].pk.int]).values_list("pk", flat=True)) == {rows[0].pk}
    assert set(Consumer.objects.filter(pk__any=[str(consumers[0].pk)]).values_list("pk", flat=True)) == {
        consumers[0].pk
    }
    assert Consumer.objects.filter(name__any=[consumers[1].name, 'it\'s "odd", {a,b}']).get() == consumers[1]


@pytest.mark.django_db
def test_any_of_nothing_matches_nothing_and_updates_nothing():
    DeliveryFactory()

    with CaptureQueriesContext(connection) as queries:
        assert list(Delivery.objects.filter(pk__any=[])) == []
        assert list(Delivery.objects.filter(pk__any=[None])) == []  # (None is dropped, as `in` drops it)
        assert Delivery.objects.filter(pk__any=[]).update(last_error="x") == 0
    assert len(queries) == 0


@pytest.mark.django_db
def test_any_of_a_subquery_is_in_of_the_subquery():
    kept, other = DeliveryFactory(), DeliveryFactory()

    found = Delivery.objects.filter(pk__any=Delivery.objects.filter(pk=kept.pk).values("pk"))

    assert list(found.values_list("pk", flat=True)) == [kept.pk]
    assert other.pk not in set(found.values_list("pk", flat=True))


# -- Ids: a claim's ids, spelled once however many filters take them (issue 26) ----------------------


@pytest.mark.django_db
def test_ids_take_the_rows_a_list_takes_and_are_taken_whole():
    from odal.core.lookups import Ids

    rows = [DeliveryFactory() for _ in range(3)]
    ids = Ids([rows[2].pk, rows[0].pk, uuid.uuid4()])
    query = Delivery.objects.filter(pk__any=ids)
    (lookup,) = query.query.where.children
    assert lookup.rhs is ids  # (not walked into a list by the filter, nor by the lookup)
    assert query.query.sql_with_params()[1] == (ids.text,)  # (one parameter, spelled once)
    assert set(query.values_list("pk", flat=True)) == {rows[0].pk, rows[2].pk}
    assert list(ids) == ids.values and len(ids) == 3


@pytest.mark.django_db
def test_ids_of_another_kind_are_prepared_and_none_match_nothing():
    from odal.core.lookups import Ids

    consumer = ConsumerFactory()
    assert list(Consumer.objects.filter(pk__any=Ids([str(consumer.pk)]))) == [consumer]  # (text: converted)
    mixed = Ids([DeliveryFactory().pk, str(uuid.uuid4())])
    assert mixed.kind is None and Delivery.objects.filter(pk__any=mixed).count() == 1
    assert not Ids([]) and Delivery.objects.filter(pk__any=Ids([])).count() == 0
    assert Delivery.objects.filter(pk__any=Ids([])).update(status="dead") == 0
