"""`field__any=[…]`: `field = ANY(%s)` with the values as one array parameter, on PostgreSQL.

`pk__in` of a claim's 500 ids sends 500 parameters: each quoted by the client and parsed by the
server, a cost per row that the sweep paid four times a batch. One array is one parameter, and
the same plan whatever the count. Elsewhere (SQLite) it is `IN`, as `__in` is.
"""

import uuid

from django.db.models import Field
from django.db.models.lookups import In


@Field.register_lookup
class Any(In):
    lookup_name = "any"

    def as_postgresql(self, compiler, connection):
        if not self.rhs_is_direct_value():  # (a subquery: IN (SELECT …) as `in` does)
            return super().as_sql(compiler, connection)
        lhs, lhs_params = self.process_lhs(compiler, connection)
        values = self.rhs  # (each already the field's type: In.get_prep_lookup)
        if not (values and all(isinstance(v, uuid.UUID | int) and not isinstance(v, bool) for v in values)):
            _, values = self.process_rhs(compiler, connection)  # (EmptyResultSet for none, as `in`)
        cast = self.lhs.output_field.cast_db_type(connection)
        return f"{lhs} = ANY(%s::{cast}[])", (*lhs_params, array(values))


def array(values) -> "str | list":
    """`values` as one array parameter: ids (UUIDs, integers) as the array's text, `{a,b,…}`,
    which the driver sends as one string; a list of them costs a quoting call per element
    (psycopg dumps lists in Python). Other values as a list, which the driver quotes."""
    values = list(values)
    if all(isinstance(v, uuid.UUID | int) and not isinstance(v, bool) for v in values):
        return "{" + ",".join(map(str, values)) + "}"
    return values
