"""`field__any=[…]`: `field = ANY(%s)` with the values as one array parameter, on PostgreSQL.

`pk__in` of a claim's 500 ids sends 500 parameters: each quoted by the client and parsed by the
server, a cost per row that the sweep paid four times a batch. One array is one parameter, and
the same plan whatever the count. Elsewhere (SQLite) it is `IN`, as `__in` is.
"""

import uuid

from django.db.models import Field, IntegerField, UUIDField
from django.db.models.lookups import In


@Field.register_lookup
class Any(In):
    lookup_name = "any"

    def ids(self) -> bool:
        """Whether the values are ids of the field's own type (a claim's UUIDs, for a UUID field;
        integers, for an integer one): they need none of `in`'s preparation, value by value, and
        go as the array's text. Anything else (text, None, an int for a UUID field) gets it."""
        if not isinstance(self.lhs.output_field, UUIDField | IntegerField):
            return False
        kind = uuid.UUID if isinstance(self.lhs.output_field, UUIDField) else int
        values = self.rhs
        return (
            isinstance(values, list | tuple | set) and bool(values) and all(type(v) is kind for v in values)
        )

    def get_prep_lookup(self):
        return list(self.rhs) if self.ids() else super().get_prep_lookup()

    def as_postgresql(self, compiler, connection):
        if not self.rhs_is_direct_value():  # (a subquery: IN (SELECT …) as `in` does)
            return super().as_sql(compiler, connection)
        lhs, lhs_params = self.process_lhs(compiler, connection)
        cast = self.lhs.output_field.cast_db_type(connection)
        if self.ids():
            return f"{lhs} = ANY(%s::{cast}[])", (*lhs_params, "{" + ",".join(map(str, self.rhs)) + "}")
        _, values = self.process_rhs(compiler, connection)  # (EmptyResultSet for none, as `in`)
        return f"{lhs} = ANY(%s::{cast}[])", (*lhs_params, list(values))
