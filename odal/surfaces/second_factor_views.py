"""The admin's two pages of the second factor (odal.core.second_factor): enrolment (a QR code and the
secret, a code to confirm, then the recovery codes shown once) and the code asked after the
password."""

from base64 import b32encode
from binascii import unhexlify

import segno
from django import forms
from django.contrib import admin
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django_otp import user_has_device

from odal.core import second_factor


class CodeForm(forms.Form):
    code = forms.CharField(
        label="Code",
        max_length=40,
        strip=True,
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "autofocus": True, "spellcheck": "false", "size": 12}
        ),
    )


def page(request, template: str, title: str, **context):
    response = TemplateResponse(
        request, template, {**admin.site.each_context(request), "title": title, **context}
    )
    add_never_cache_headers(response)  # a secret or codes on it: no cache or history keeps them
    return response


def next_url(request) -> str:
    wanted = request.POST.get("next") or request.GET.get("next") or ""
    safe = url_has_allowed_host_and_scheme(wanted, {request.get_host()}, require_https=request.is_secure())
    return wanted if safe else reverse("admin:index")


def enrol_view(request):
    """Set up the authenticator: the secret as a QR code and as text, and a code to confirm it."""
    user = request.user
    if second_factor.owed(request) == "code":  # a device already: prove it first
        return redirect(f"{reverse('odal_second_factor_code')}?{request.GET.urlencode()}")
    if user_has_device(user):
        return page(request, "admin/second_factor/on.html", "Two-factor sign-in",
                    codes_left=second_factor.recovery_codes_left(user))  # fmt: skip
    form = CodeForm(request.POST or None)
    if form.is_valid():
        codes = second_factor.enrol(request, form.cleaned_data["code"])
        if codes is not None:
            return page(request, "admin/second_factor/recovery_codes.html", "Your recovery codes",
                        codes="\n".join(codes), count=len(codes), next=next_url(request))  # fmt: skip
        form.add_error(
            "code",
            "That code is not right: type the six digits your authenticator app shows now for odal "
            "(after scanning this page's QR code or typing its secret).",
        )
    key = second_factor.pending_key(request)
    device = second_factor.unsaved_device(user, key)
    secret = b32encode(unhexlify(key)).decode()
    return page(
        request, "admin/second_factor/enrol.html", "Set up two-factor sign-in",
        form=form, secret=" ".join(secret[i : i + 4] for i in range(0, len(secret), 4)),
        qr=segno.make(device.config_url, error="m").svg_data_uri(scale=5, dark="#000", light="#fff"),
        required=second_factor.owed(request) == "enrol", next=request.GET.get("next", ""),
    )  # fmt: skip


def code_view(request):
    """The second step of signing in: a code from the authenticator, or a recovery code."""
    owes = second_factor.owed(request)
    if owes != "code":
        return redirect(
            f"{reverse('odal_second_factor')}?{request.GET.urlencode()}" if owes else next_url(request)
        )
    form = CodeForm(request.POST or None)
    if form.is_valid():
        refused = second_factor.check_code(request, form.cleaned_data["code"])
        if refused is None:
            return redirect(next_url(request))
        form.add_error("code", refused)
    return page(request, "admin/second_factor/code.html", "Your second factor", form=form,
                next=request.GET.get("next", ""))  # fmt: skip
