"""Counts kept by the writes (odal_tally) and the workers' heartbeats (odal_heartbeat).

Triggers add to the tally in the transaction of the write they count (see odal.core.tally for the
figures). On PostgreSQL they are statement-level, with transition tables: one upsert per
statement, whatever the number of rows, into rows of the writing session's own (its backend
pid), so two sweeps never wait on one counter row.

The triggers are created before the tally is seeded from the rows already there: creating a
trigger locks its table against writes until this migration commits, so no write falls between
the seed's count and the first count a trigger makes.
"""

from django.db import migrations, models

PROTOCOL_ERROR = "protocol error: "  # registry.adapters.PROTOCOL_ERROR, as of this migration
HOUR_PG = "date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
UPSERT_PG = "ON CONFLICT (metric, key, hour, shard) DO UPDATE SET value = odal_tally.value + EXCLUDED.value"

PG = f"""
CREATE FUNCTION odal_tally_delivery_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO odal_tally (metric, key, hour, shard, value)
    SELECT 'outbox.delivered', n.consumer_id::text, {HOUR_PG}, pg_backend_pid(), count(*)
    FROM new_rows n WHERE n.status = 'delivered' GROUP BY n.consumer_id ORDER BY 2
    {UPSERT_PG};
    RETURN NULL;
END $$;
CREATE TRIGGER odal_tally_delivery_insert AFTER INSERT ON outbox_delivery
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION odal_tally_delivery_insert();

CREATE FUNCTION odal_tally_delivery_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO odal_tally (metric, key, hour, shard, value)
    SELECT 'outbox.delivered', n.consumer_id::text, {HOUR_PG}, pg_backend_pid(), count(*)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.status = 'delivered' AND o.status <> 'delivered'
    GROUP BY n.consumer_id ORDER BY 2
    {UPSERT_PG};
    RETURN NULL;
END $$;
CREATE TRIGGER odal_tally_delivery_update AFTER UPDATE ON outbox_delivery
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION odal_tally_delivery_update();

CREATE FUNCTION odal_tally_attempt_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO odal_tally (metric, key, hour, shard, value)
    SELECT 'outbox.attempts', n.outcome || CASE WHEN n.late THEN ':late' ELSE '' END,
           date_trunc('hour', n.finished_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', pg_backend_pid(), count(*)
    FROM new_rows n GROUP BY 2, 3 ORDER BY 2, 3
    {UPSERT_PG};
    RETURN NULL;
END $$;
CREATE TRIGGER odal_tally_attempt_insert AFTER INSERT ON outbox_deliveryattempt
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION odal_tally_attempt_insert();

CREATE FUNCTION odal_tally_registration_change() RETURNS trigger LANGUAGE plpgsql AS $$
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
            SELECT o.status, -1 AS d FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.status <> n.status
            UNION ALL
            SELECT n.status, 1 FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.status <> n.status
        ) moves
        GROUP BY status HAVING sum(d) <> 0 ORDER BY 2
        {UPSERT_PG};
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER odal_tally_registration_insert AFTER INSERT ON registry_registration
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION odal_tally_registration_change();
CREATE TRIGGER odal_tally_registration_update AFTER UPDATE ON registry_registration
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION odal_tally_registration_change();
CREATE TRIGGER odal_tally_registration_delete AFTER DELETE ON registry_registration
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION odal_tally_registration_change();

CREATE FUNCTION odal_tally_regattempt_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO odal_tally (metric, key, hour, shard, value)
    SELECT metric, key, {HOUR_PG}, pg_backend_pid(), count(*)
    FROM (
        SELECT 'registry.late' AS metric, operation AS key FROM new_rows WHERE late
        UNION ALL
        SELECT 'registry.protocol_errors', operation FROM new_rows
            WHERE outcome = 'failed' AND left(answer, {len(PROTOCOL_ERROR)}) = '{PROTOCOL_ERROR}'
        UNION ALL
        SELECT 'registry.write_errors', '' FROM new_rows WHERE outcome = 'write_error'
    ) counted
    GROUP BY metric, key ORDER BY 1, 2
    {UPSERT_PG};
    RETURN NULL;
END $$;
CREATE TRIGGER odal_tally_regattempt_insert AFTER INSERT ON registry_registrationattempt
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION odal_tally_regattempt_insert();
"""

PG_SEED = f"""
INSERT INTO odal_tally (metric, key, hour, shard, value)
SELECT 'outbox.delivered', consumer_id::text, 'epoch', 0, count(*)
FROM outbox_delivery WHERE status = 'delivered' GROUP BY consumer_id;
INSERT INTO odal_tally (metric, key, hour, shard, value)
SELECT 'outbox.attempts', outcome || CASE WHEN late THEN ':late' ELSE '' END,
       CASE WHEN finished_at > now() - interval '48 hours'
            THEN date_trunc('hour', finished_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' ELSE 'epoch' END,
       0, count(*)
FROM outbox_deliveryattempt GROUP BY 2, 3;
INSERT INTO odal_tally (metric, key, hour, shard, value)
SELECT 'registry.status', status, 'epoch', 0, count(*) FROM registry_registration GROUP BY status;
INSERT INTO odal_tally (metric, key, hour, shard, value)
SELECT metric, key, 'epoch', 0, count(*) FROM (
    SELECT 'registry.late' AS metric, operation AS key FROM registry_registrationattempt WHERE late
    UNION ALL
    SELECT 'registry.protocol_errors', operation FROM registry_registrationattempt
        WHERE outcome = 'failed' AND left(answer, {len(PROTOCOL_ERROR)}) = '{PROTOCOL_ERROR}'
    UNION ALL
    SELECT 'registry.write_errors', '' FROM registry_registrationattempt WHERE outcome = 'write_error'
) counted GROUP BY metric, key;
"""

PG_REMOVE = """
DROP TRIGGER IF EXISTS odal_tally_delivery_insert ON outbox_delivery;
DROP TRIGGER IF EXISTS odal_tally_delivery_update ON outbox_delivery;
DROP TRIGGER IF EXISTS odal_tally_attempt_insert ON outbox_deliveryattempt;
DROP TRIGGER IF EXISTS odal_tally_registration_insert ON registry_registration;
DROP TRIGGER IF EXISTS odal_tally_registration_update ON registry_registration;
DROP TRIGGER IF EXISTS odal_tally_registration_delete ON registry_registration;
DROP TRIGGER IF EXISTS odal_tally_regattempt_insert ON registry_registrationattempt;
DROP FUNCTION IF EXISTS odal_tally_delivery_insert();
DROP FUNCTION IF EXISTS odal_tally_delivery_update();
DROP FUNCTION IF EXISTS odal_tally_attempt_insert();
DROP FUNCTION IF EXISTS odal_tally_registration_change();
DROP FUNCTION IF EXISTS odal_tally_regattempt_insert();
"""

def install(apps, schema_editor):
    schema_editor.execute(PG, params=None)
    schema_editor.execute(PG_SEED, params=None)


def remove(apps, schema_editor):
    schema_editor.execute(PG_REMOVE, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("odal", "0004_canonical_upis"),
        ("outbox", "0006_post_event_permission"),
        ("registry", "0004_registry_ids_500"),
    ]

    operations = [
        migrations.CreateModel(
            name="Tally",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("metric", models.CharField(max_length=64)),
                ("key", models.CharField(blank=True, default="", max_length=200)),
                ("hour", models.DateTimeField()),
                ("shard", models.IntegerField(default=0)),
                ("value", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("metric", "key", "hour", "shard"), name="tally_bucket")
                ],
            },
        ),
        migrations.CreateModel(
            name="Heartbeat",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("role", models.CharField(max_length=32)),
                ("worker", models.CharField(max_length=200)),
                ("at", models.DateTimeField()),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("role", "worker"), name="one_heartbeat_per_worker")],
                "indexes": [models.Index(fields=["role", "-at"], name="heartbeat_latest_idx")],
            },
        ),
        migrations.RunPython(install, remove),
    ]
