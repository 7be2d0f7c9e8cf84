"""The admin's base classes, which every app's admin builds on (outbox/admin.py, registry/admin.py,
odal.surfaces.admin): capped and checked lists, storable forms, live pages."""

import contextlib
from datetime import datetime, timedelta

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes import views as contenttype_views
from django.core.exceptions import EmptyResultSet, ValidationError
from django.core.paginator import Paginator
from django.db import connection, models
from django.db.models.constants import LOOKUP_SEP
from django.http import Http404
from django.utils.functional import cached_property

from odal.core.admin_actions import (
    StorableFormMixin,
    StorableJSONField,
    StorableModelForm,
)
from odal.core.errors import Refused
from odal.core.reasons import MAX_REASON_LENGTH, clean_reason

# The admin's models of a live kind (object pages, lists) and what reads a page's stamp: those of
# odal.surfaces.live, which read both apps, handed over as its app starts (serve_live_pages).
OBJECT_KINDS: dict = {}
LIST_KINDS: dict = {}
page_config = None


def serve_live_pages(object_kinds: dict, list_kinds: dict, config) -> None:
    global page_config
    OBJECT_KINDS.update(object_kinds)
    LIST_KINDS.update(list_kinds)
    page_config = config


class LiveAdmin:
    """Mixed into OdalAdmin: an object page or list of a live kind reads its stamp first (see
    odal.surfaces.live) and leaves it on the request for the page's head (odal_live tag)."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        kind = OBJECT_KINDS.get(self.model)
        if kind and object_id and request.method == "GET":
            # An id that names nothing gets no live part: Django's own view answers it.
            with contextlib.suppress(ValidationError, Http404):
                request.odal_live = page_config(request, kind, self.model._meta.pk.to_python(object_id))
        return super().changeform_view(request, object_id, form_url, extra_context)

    def changelist_view(self, request, extra_context=None):
        kind = LIST_KINDS.get(self.model)
        if kind and request.method == "GET":
            request.odal_live = page_config(request, kind)
        return super().changelist_view(request, extra_context)


class CappedPaginator(Paginator):
    """Counts a list up to CAP rows and no further, so a list over ten million delivered rows
    opens as fast as one over ten thousand (Django's own paginator counts every row, on every
    page view). Past the cap the list says "more than 10,000": narrow it with a filter."""

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        # SELECT count(*) FROM (... LIMIT CAP + 1), in no order: any CAP + 1 rows count the same as
        # the first CAP + 1, and without the list's ORDER BY the count of a filter that its order's
        # index does not serve (an event type) need not read and sort every row it matches.
        found = self.object_list.order_by()[: self.CAP + 1].count()
        self.capped = found > self.CAP
        return min(found, self.CAP)

    capped = False


def distinct_values(model, column: str) -> list:
    """The distinct values of `column` (a NOT NULL column that leads an index of `model`'s table),
    in order, found by hopping through that index (a recursive query: one index probe per
    value), not by reading every row as SELECT DISTINCT does: the same cost over ten million rows
    as over ten thousand."""
    table, col = connection.ops.quote_name(model._meta.db_table), connection.ops.quote_name(column)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE hops(v) AS (
                SELECT (SELECT {col} FROM {table} ORDER BY {col} LIMIT 1)
                UNION ALL
                SELECT (SELECT {col} FROM {table} WHERE {col} > hops.v ORDER BY {col} LIMIT 1)
                FROM hops WHERE hops.v IS NOT NULL
            )
            SELECT v FROM hops WHERE v IS NOT NULL
            """
        )
        return [row[0] for row in cursor.fetchall()]


class DistinctValuesFilter(admin.AllValuesFieldListFilter):
    """Django's filter by each value a column holds, its values found by distinct_values (Django's
    own reads the whole table, SELECT DISTINCT, on every view of the list)."""

    def __init__(self, field, request, params, model, model_admin, field_path):
        super().__init__(field, request, params, model, model_admin, field_path)
        self.lookup_choices = distinct_values(model, field.column)


class CheckedChangeList(ChangeList):
    """Django's list, answering every URL a person may type with a list or a wrong lookup (the
    list redirects with ?e=1), never a 500:

    - The date drill-down opens every period it links to. Django bounds the period it filters on
      by the start of the next one, and so failed on year 9999's, its December's and its last
      day's (the next starts past datetime.max), and on a year too large for an integer of C.
      The last periods are filtered on by their year, month and day as they stand (no bound to
      make); a year past 9999, however large, is a wrong lookup, as 2026-13 is.
    - A lookup whose value the database's SQL cannot be made of (`created_at__year=-1`, a year
      past 9999 on any date, `__year__gt=10**30`) is a wrong lookup: the list's query is made
      before it runs, where Django only makes it as it runs (a ValueError or an OverflowError
      from deep in the query, a 500)."""

    def get_queryset(self, request, exclude_parameters=None):
        queryset = super().get_queryset(request, exclude_parameters)
        try:
            queryset.query.get_compiler(queryset.db).as_sql()
        except EmptyResultSet:
            pass  # (a list of nothing: no SQL asks for it, and Django's list answers it as empty)
        except (ValueError, OverflowError, TypeError, IndexError) as exc:
            raise IncorrectLookupParameters(exc) from exc
        return queryset

    def get_filters(self, request):
        if self.date_hierarchy is None or not self._period_runs_out():
            return super().get_filters(request)
        # Without the hierarchy, its __year, __month and __day filter as given.
        hierarchy, self.date_hierarchy = self.date_hierarchy, None
        try:
            return super().get_filters(request)
        finally:
            self.date_hierarchy = hierarchy

    def _period_runs_out(self) -> bool:
        """Whether the drill-down's period ends past the last datetime there is (Django's
        arithmetic, which cannot make that end). A date that cannot be is refused here, as
        Django refuses it (its own refusal lets an OverflowError through)."""
        params = self.get_filters_params()
        year, month, day = (params.get(f"{self.date_hierarchy}__{part}") for part in ("year", "month", "day"))
        if year is None:
            return False
        try:
            start = datetime(int(year[-1]), int(month[-1]) if month else 1, int(day[-1]) if day else 1)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc
        try:
            if day:
                start + timedelta(days=1)
            elif month:
                (start + timedelta(days=32)).replace(day=1)
            else:
                start.replace(year=start.year + 1)
        except (ValueError, OverflowError):
            return True
        return False


class CheckedLists:
    """Mixed into every admin of the site (OdalAdmin, and the others' in odal.core.apps): lists that
    answer a typed URL with a list or a wrong lookup (CheckedChangeList), and no lookup that no
    list offers and that PostgreSQL may refuse or take minutes over: a regular expression
    (`?upi__regex=(` is a DataError, `x{1000}{1000}` too complex), or a range (Django reads
    `?pk__range=999` a character per bound). Refused lookups answer 400."""

    REFUSED_LOOKUPS = frozenset({"regex", "iregex", "range"})

    def lookup_allowed(self, lookup, value, request=None):
        if lookup.rsplit(LOOKUP_SEP, 1)[-1] in self.REFUSED_LOOKUPS:
            return False
        return super().lookup_allowed(lookup, value, request)

    def get_changelist(self, request, **kwargs):
        return CheckedChangeList


def check_every_list(site) -> None:
    """Make every admin registered on `site` one with CheckedLists (Django's own and django-q2's:
    a 500 from a typed URL is one wherever it is)."""
    for model, model_admin in list(site._registry.items()):
        if not isinstance(model_admin, CheckedLists):
            site.unregister(model)
            site.register(model, type(type(model_admin).__name__, (CheckedLists, type(model_admin)), {}))


def view_on_site(request, content_type_id, object_id):
    """The admin's "view on site" (admin/r/<type>/<id>/), Django's, with an id that cannot be a
    key of its model ("abc" for a UUID) a 404 as an id that names no row is: Django's lets the
    ValidationError through (a 500). Served in its place by odal.urls, behind the admin's login."""
    try:
        return contenttype_views.shortcut(request, content_type_id, object_id)
    except ValidationError:
        raise Http404(f"There is no object {object_id} of content type {content_type_id}.") from None


class OdalAdmin(LiveAdmin, CheckedLists, admin.ModelAdmin):
    """Every odal admin: forms that refuse what PostgreSQL cannot store, actions that refuse a
    selection naming no row instead of failing on it, lists whose count stops at
    CappedPaginator.CAP and that answer a typed URL with a list or a wrong lookup (CheckedLists);
    pages that refresh their changing parts in place (LiveAdmin)."""

    form = StorableModelForm
    paginator = CappedPaginator
    show_full_result_count = False  # (another count of the whole table)
    # No "Show counts": a count per filter choice of every row the list matches, uncapped.
    show_facets = admin.ShowFacets.NEVER
    formfield_overrides = {
        # A URL typed without a scheme reads as https (Django 6's default, asked for now).
        models.URLField: {"assume_scheme": "https"},
        models.JSONField: {"form_class": StorableJSONField},
    }

    def response_action(self, request, queryset):
        # Django filters on the posted ids as they are: one that is not a primary key at all
        # ("abc" for a UUID) raises, and the action would end in a 500.
        pk = self.model._meta.pk
        try:
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                pk.run_validators(pk.to_python(value))
        except ValidationError:
            self.message_user(
                request,
                "The selection names something that is not one of the rows listed here; nothing was "
                "changed. Select the rows again.",
                messages.ERROR,
            )
            return None
        return super().response_action(request, queryset)


class ReadOnlyAdmin(OdalAdmin):
    """History and outbox rows: viewable, changed only through their actions (if any)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyInline(admin.TabularInline):
    """An attempt log under its row: every field shown, nothing added, changed or deleted."""

    extra = 0
    can_delete = False

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def actor_of(request) -> str:
    return f"user:{request.user.get_username()}"


class OptionalReasonForm(StorableFormMixin, forms.Form):
    reason = forms.CharField(
        max_length=MAX_REASON_LENGTH,
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text="Optional. Kept in the audit trail with your name.",
    )

    def clean_reason(self):
        value = self.cleaned_data.get("reason", "")
        if not value.strip():
            return ""
        try:
            return clean_reason(value)
        except Refused as exc:
            raise forms.ValidationError(exc.detail) from None
