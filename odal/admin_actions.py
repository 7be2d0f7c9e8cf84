"""Two-pass admin actions that need a reason, shaped like Django's own delete_selected: the first
pass renders a page with a reason form (and the selected ids hidden in it); the second validates,
performs the write and reports what it changed."""

from django import forms
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from odal.errors import Refused
from odal.reasons import MAX_REASON_LENGTH, clean_reason


class ReasonForm(forms.Form):
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
    rows=None,
    headers=None,
    extra=None,
    form_class=ReasonForm,
):
    """Run `perform(cleaned_data)` on the second pass once the form (a reason, and whatever else
    `form_class` asks) is valid, and return None so the admin goes back to the list; otherwise
    render the page (again, with its errors)."""
    form = form_class(request.POST if request.POST.get("post") else None)
    if request.POST.get("post") and form.is_valid():
        perform(form.cleaned_data)
        return None
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "intro": intro,
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
