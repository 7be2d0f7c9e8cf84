"""The tally's UPDATE triggers no longer join their transition tables.

Migration 0005 paired each updated row's old and new version with `old_rows JOIN new_rows ON id`.
PostgreSQL plans a trigger's query once per session and knows nothing of a transition table's
size, so it took a nested loop: a sweep settling 500 deliveries compared 250,000 pairs, 20–45 ms
of a 500-row settle that is itself 12 ms (issue 26), and a statement of n rows cost n². Now:

- a delivery is counted when it becomes delivered: the rows delivered after the statement less
  the rows delivered before it (`EXCEPT ALL` by id and consumer, a hashed set difference; a
  delivery's consumer never changes);
- a registration's move: every old version takes one from its status, every new version adds one
  to its own; a row whose status did not change adds nothing in sum, as before.
"""

import importlib

from django.db import migrations

tally = importlib.import_module("odal.core.migrations.0005_tally_and_heartbeats")
HOUR_PG, UPSERT_PG = tally.HOUR_PG, tally.UPSERT_PG

FORWARD = f"""
CREATE OR REPLACE FUNCTION odal_tally_delivery_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO odal_tally (metric, key, hour, shard, value)
    SELECT 'outbox.delivered', became.consumer_id::text, {HOUR_PG}, pg_backend_pid(), count(*)
    FROM (
        SELECT id, consumer_id FROM new_rows WHERE status = 'delivered'
        EXCEPT ALL
        SELECT id, consumer_id FROM old_rows WHERE status = 'delivered'
    ) became
    GROUP BY became.consumer_id ORDER BY 2
    {UPSERT_PG};
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION odal_tally_registration_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO odal_tally (metric, key, hour, shard, value)
        SELECT 'registry.status', status, {HOUR_PG}, pg_backend_pid(), count(*)
        FROM new_rows GROUP BY status ORDER BY 2
        {UPSERT_PG};
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO odal_tally (metric, key, hour, shard, value)
        SELECT 'registry.status', status, {HOUR_PG}, pg_backend_pid(), -count(*)
        FROM old_rows GROUP BY status ORDER BY 2
        {UPSERT_PG};
    ELSE
        INSERT INTO odal_tally (metric, key, hour, shard, value)
        SELECT 'registry.status', status, {HOUR_PG}, pg_backend_pid(), sum(d)
        FROM (
            SELECT status, -1 AS d FROM old_rows
            UNION ALL
            SELECT status, 1 FROM new_rows
        ) moves
        GROUP BY status HAVING sum(d) <> 0 ORDER BY 2
        {UPSERT_PG};
    END IF;
    RETURN NULL;
END $$;
"""


def _functions_of_0005() -> str:
    """Migration 0005's text of the two functions (to go back to)."""
    start = tally.PG.index("CREATE FUNCTION odal_tally_delivery_update()")
    end = tally.PG.index("CREATE TRIGGER odal_tally_delivery_update")
    registration = tally.PG.index("CREATE FUNCTION odal_tally_registration_change()")
    registration_end = tally.PG.index("CREATE TRIGGER odal_tally_registration_insert")
    return (tally.PG[start:end] + tally.PG[registration:registration_end]).replace(
        "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
    )


def forward(apps, schema_editor):
    schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    schema_editor.execute(_functions_of_0005(), params=None)


class Migration(migrations.Migration):
    dependencies = [("odal", "0010_kick_moves_here")]

    operations = [migrations.RunPython(forward, backward)]
