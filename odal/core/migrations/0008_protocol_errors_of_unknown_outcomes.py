"""registry_protocol_errors_total counts a register answered with something that is not the
protocol's JSON again. Such an attempt's outcome is now `unknown` (the request may have reached
the registry), no longer `failed`: the tally's trigger counts protocol errors of either.
This migration changes PostgreSQL's function in place.
"""

import importlib

from django.db import migrations

tally = importlib.import_module("odal.core.migrations.0005_tally_and_heartbeats")
PROTOCOL_ERROR, HOUR_PG, UPSERT_PG = tally.PROTOCOL_ERROR, tally.HOUR_PG, tally.UPSERT_PG


def regattempt_function(outcomes: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION odal_tally_regattempt_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO odal_tally (metric, key, hour, shard, value)
    SELECT metric, key, {HOUR_PG}, pg_backend_pid(), count(*)
    FROM (
        SELECT 'registry.late' AS metric, operation AS key FROM new_rows WHERE late
        UNION ALL
        SELECT 'registry.protocol_errors', operation FROM new_rows
            WHERE outcome IN ({outcomes}) AND left(answer, {len(PROTOCOL_ERROR)}) = '{PROTOCOL_ERROR}'
        UNION ALL
        SELECT 'registry.write_errors', '' FROM new_rows WHERE outcome = 'write_error'
    ) counted
    GROUP BY metric, key ORDER BY 1, 2
    {UPSERT_PG};
    RETURN NULL;
END $$;
"""


def forward(apps, schema_editor):
    schema_editor.execute(regattempt_function("'failed', 'unknown'"), params=None)


def backward(apps, schema_editor):
    schema_editor.execute(regattempt_function("'failed'"), params=None)


class Migration(migrations.Migration):
    dependencies = [("odal", "0007_passport_listing_index")]

    operations = [migrations.RunPython(forward, backward)]
