"""Many rows of one model in one INSERT, at a fraction of bulk_create's cost (bulk intake, odal.surfaces.bulk).

At a thousand rows, bulk_create spends most of its time in Python: a model instance per row,
then one SQL parameter per value, each prepared by its field and quoted by the driver. On
PostgreSQL, insert_rows() sends the rows as one JSON document instead, which the server unpacks
with `jsonb_to_recordset` into the table's column types; values every row shares are sent once,
and a UUID primary key left to its default is made by the server (`odal_uuid7()` or
`gen_random_uuid()`, see SERVER_MADE). About a third of bulk_create's time here.
"""

import json
import uuid
from datetime import datetime

from django.db import connection, models

from odal.core.ids import uuid7

# Keys the server makes in the INSERT, for a primary key left to one of these defaults.
SERVER_MADE = {uuid.uuid4: "gen_random_uuid()", uuid7: "odal_uuid7()"}


class _Encoder(json.JSONEncoder):
    """Values as PostgreSQL reads them back into their columns: times to the microsecond (Django's
    encoder keeps milliseconds), UUIDs as text."""

    def default(self, o):
        if isinstance(o, datetime):
            return o.isoformat()
        if isinstance(o, uuid.UUID):
            return str(o)
        return super().default(o)


def _left_out(model, given) -> tuple[dict, dict]:
    """The fields no row gives: those with one value for every row (a constant default, or null),
    and those whose default is made per row (a callable: uuid4, timezone.now)."""
    fixed, made = {}, {}
    for f in model._meta.concrete_fields:
        if f.attname in given or f.db_returning:  # (an AutoField: the database numbers it)
            continue
        if f.has_default() and callable(f.default):
            made[f.attname] = f.default
        elif f.has_default() or f.null:
            fixed[f.attname] = f.get_default()
        else:
            raise ValueError(f"{model.__name__}.{f.attname} has no default: give it")
    return fixed, made


def insert_rows(
    model: type[models.Model], rows: list[dict], *, same: dict | None = None, ignore_conflicts: bool = False
) -> set:
    """INSERT `rows` of `model` in one statement. Each row is a dict of field attnames
    (`passport_id`, not `passport`) to values, every row the same keys; `same` holds the values
    every row shares; the fields left out take their defaults, as bulk_create gives them.
    `ignore_conflicts`: a row that would break a unique constraint is left out (ON CONFLICT DO
    NOTHING), after waiting, as any INSERT does, for a transaction holding the conflicting row to
    end. Returns the primary keys of the rows inserted."""
    if not rows:
        return set()
    same = same or {}
    pk = model._meta.pk
    fixed, made = _left_out(model, [*rows[0], *same])
    fields = {f.attname: f for f in model._meta.concrete_fields}
    server_made = {name: SERVER_MADE[make] for name, make in made.items() if make in SERVER_MADE}
    made = {name: make for name, make in made.items() if name not in server_made}
    if made:
        rows = [{**row, **{name: make() for name, make in made.items()}} for row in rows]
    given = [*rows[0]]
    if any(fields[name].column != name for name in given):  # the document's keys are the columns
        raise ValueError(f"insert_rows: a field of {model.__name__} given has a column of another name")
    shared = {**fixed, **same}
    qn = connection.ops.quote_name
    columns = [qn(fields[name].column) for name in [*given, *shared, *server_made]]
    values = [f"t.{qn(name)}" for name in given]
    values += [f"%s::{fields[name].db_type(connection)}" for name in shared] + [*server_made.values()]
    spec = ", ".join(f"{qn(name)} {fields[name].db_type(connection)}" for name in given)
    sql = (
        f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(values)} FROM jsonb_to_recordset(%s::jsonb) AS t({spec})"
        f"{' ON CONFLICT DO NOTHING' if ignore_conflicts else ''} RETURNING {qn(pk.column)}"
    )
    params = [fields[name].get_db_prep_save(value, connection) for name, value in shared.items()]
    document = json.dumps(rows, cls=_Encoder, separators=(",", ":"))
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, document])
        return {pk.to_python(row[0]) for row in cursor.fetchall()}
