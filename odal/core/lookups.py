"""`field__any=[…]`: `field = ANY(%s)` with the values as one array parameter.

`pk__in` of a claim's 500 ids sends 500 parameters: each quoted by the client and parsed by the
server, a cost per row that the sweep paid four times a batch. One array is one parameter, and
the same plan whatever the count. The values may
be an Ids: spelled once, however many filters they go to.
"""

import uuid

from django.db.models import Field, IntegerField, UUIDField
from django.db.models.lookups import In


class Ids:
    """Primary keys of one type (UUIDs or integers) for `field__any=`, checked and spelled once.
    Django walks a list or a tuple given to a filter value by value (each might be an expression),
    for every filter it is given to, and Any checked and spelled it again for each statement: a
    claim's 500 ids go to three statements a pass, a few microseconds a row in all. An Ids is
    not a list: a filter takes it whole. Iterating it gives the values, in order."""

    __slots__ = ("values", "kind", "text")

    def __init__(self, values):
        self.values = list(values)
        kinds = {type(v) for v in self.values}
        self.kind = kinds.pop() if len(kinds) == 1 and kinds <= {uuid.UUID, int} else None
        self.text = "{" + ",".join(map(str, self.values)) + "}" if self.kind else None

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"Ids({self.values!r})"


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
        if isinstance(values, Ids):
            return values.kind is kind and bool(values)
        return (
            isinstance(values, list | tuple | set) and bool(values) and all(type(v) is kind for v in values)
        )

    def get_prep_lookup(self):
        if self.ids():
            return self.rhs if isinstance(self.rhs, Ids) else list(self.rhs)
        return super().get_prep_lookup()

    def as_sql(self, compiler, connection):
        if not self.rhs_is_direct_value():  # (a subquery: IN (SELECT …) as `in` does)
            return super().as_sql(compiler, connection)
        lhs, lhs_params = self.process_lhs(compiler, connection)
        cast = self.lhs.output_field.cast_db_type(connection)
        if self.ids():
            text = self.rhs.text if isinstance(self.rhs, Ids) else "{" + ",".join(map(str, self.rhs)) + "}"
            return f"{lhs} = ANY(%s::{cast}[])", (*lhs_params, text)
        _, values = self.process_rhs(compiler, connection)  # (EmptyResultSet for none, as `in`)
        return f"{lhs} = ANY(%s::{cast}[])", (*lhs_params, list(values))
