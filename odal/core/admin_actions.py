"""Two-pass admin actions that need a reason, shaped like Django's own delete_selected: the first
pass renders a page with a reason form (and the selected ids hidden in it); the second validates,
performs the write and reports what it changed. Also the admin forms' refusal of what PostgreSQL
cannot store."""

import json

from django import forms
from django.contrib.admin import helpers
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers

from odal.core.errors import Refused
from odal.core.reasons import MAX_REASON_LENGTH, clean_reason
from odal.core.text import JSON_NUMBERS, MAX_JSON_DEPTH, find_unstorable


class StorableFormMixin:
    """Refuses, as a field error, any value (a string, or a key or string at any depth of a
    JSON field) PostgreSQL cannot store. CharField already refuses a NUL typed into it, but a
    JSON field's text can spell one (\\u0000) or a lone surrogate (\\ud800), and saving that
    would be a 500."""

    def clean(self):
        data = super().clean()
        for name, value in list(data.items()):
            found = find_unstorable(value, name, max_depth=MAX_JSON_DEPTH)
            if found:
                self.add_error(name, f"{found[0]} {found[1]}.")
        return data


class CheckedNumbers(json.JSONDecoder):
    """json's decoder reading numbers as the API does (odal.core.text.JSON_NUMBERS): one odal would not
    give back as typed (NaN, 1e308, -0.0, an integer of more than 4,300 digits) is kept in place,
    for StorableFormMixin to refuse naming its field."""

    def __init__(self, **kwargs):
        super().__init__(**{**kwargs, **JSON_NUMBERS})


class StorableJSONField(forms.JSONField):
    """Django's JSONField, where JSON too deep for Python's parser (about 1,000 levels) is a form
    error rather than a RecursionError, numbers are read as the API reads them (CheckedNumbers),
    and a refused value is shown again as typed."""

    def __init__(self, *, decoder=None, **kwargs):
        super().__init__(decoder=decoder or CheckedNumbers, **kwargs)  # (a model field passes None)

    def to_python(self, value):
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(f"Nested more than {MAX_JSON_DEPTH} levels deep.") from None

    def bound_data(self, data, initial):
        try:
            value = super().bound_data(data, initial)
        except RecursionError:
            return forms.fields.InvalidJSONInput(data)
        # Encoded again for the page, a lone surrogate could not even be sent to the browser.
        if find_unstorable(value, max_depth=MAX_JSON_DEPTH):
            return forms.fields.InvalidJSONInput(data)
        return value


class StorableModelForm(StorableFormMixin, forms.ModelForm):
    pass


class ReasonForm(StorableFormMixin, forms.Form):
    reason = forms.CharField(
        max_length=MAX_REASON_LENGTH,
        required=False,  # clean_reason gives the sentence for a blank one
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Required. Kept in the audit trail with your name.",
    )

    def clean_reason(self):
        try:
            return clean_reason(self.cleaned_data.get("reason"))
        except Refused as exc:
            raise forms.ValidationError(exc.detail) from None


def reason_action(
    modeladmin,
    request,
    queryset,
    *,
    title,
    perform,
    intro="",
    warning=None,
    rows=None,
    headers=None,
    extra=None,
    form_class=ReasonForm,
):
    """Run `perform(cleaned_data)` on the second pass once the form (a reason, and whatever else
    `form_class` asks) is valid, and return what it returns: None, so the admin goes back to the
    list, or a page of its own (secret_page); otherwise
    render the page (again, with its errors). A `warning` is shown above the intro, as the
    admin shows a warning message."""
    form = form_class(request.POST if request.POST.get("post") else None)
    if request.POST.get("post") and form.is_valid():
        return perform(form.cleaned_data)
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "intro": intro,
        "warning": warning,
        "form": form,
        "queryset": queryset,
        "rows": rows if rows is not None else [str(obj) for obj in queryset],
        "headers": headers,
        "extra": extra or {},
        "opts": modeladmin.model._meta,
        "action": request.POST.get("action", ""),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
    }
    return TemplateResponse(request, "admin/reason_action.html", context)


def secret_page(modeladmin, request, *, title: str, label: str, secret: str, lines=()):
    """The answer of the POST that made a secret (an API token, a consumer's signing secret): a
    page of its own that shows it this once. Never a message (Django keeps those in a cookie or
    the session until they are shown), never a redirect, and no-store so that no cache or
    browser history keeps it."""
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "label": label,
        "secret": secret,
        "lines": list(lines),
        "opts": modeladmin.model._meta,
    }
    response = TemplateResponse(request, "admin/secret_once.html", context)
    # Cache-Control: max-age=0, no-cache, no-store, must-revalidate, private. (Every admin view is
    # never_cache already, through AdminSite.admin_view; said again here, where it matters most.)
    add_never_cache_headers(response)
    return response
