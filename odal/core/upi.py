"""A passport's UPI (unique product identifier) and its one canonical spelling.

The same https URL can be written many ways: `HTTPS://ID.EXAMPLE.EU:443/01/%7e1` and
`https://id.example.eu/01/~1` name one product, and GS1 Digital Link resolvers treat them as one.
odal stores every UPI in its canonical form and compares canonical forms (a new passport, the
registry's task list), so one product is one passport however its UPI was typed:

- scheme and host in lower case (a non-ASCII host in its IDNA form, `xn--…`);
- no port when it is the default one (443), and no leading zeros in one that is not;
- percent-encoding normalised in the path, query and fragment: escapes of unreserved characters
  (letters, digits, `-._~`) decoded, other escapes in upper-case hex, and characters a URI
  cannot hold (non-ASCII, `"<>\\^`{|}`) escaped as UTF-8;
- an empty path as `/`.
The path, query and fragment keep their case otherwise (`/01/ABC` and `/01/abc` are two UPIs).

canonical_upi() is the one definition; the API (odal.core.schemas.check_upi), `odal passport create`,
the admin's passport form (odal.surfaces.admin.PassportAdminForm), the registry lookup and the migration that rewrote the
UPIs stored before (odal 0004, canonicalise_upis) all use it.
"""

import re
from collections import defaultdict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, transaction

from odal.core.text import unstorable

MAX_UPI_LENGTH = 2000  # the passport's upi column
DEFAULT_PORT = 443
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# an escape (%XX), a % that starts none, or a character a URI cannot hold as it is
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})|%|[^\x21-\x7e]|[\"<>\\^`{|}]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_https = URLValidator(schemes=["https"])


def canonical_upi(value) -> str:
    """`value` (a UPI as typed or as a registry spells it) in its canonical form; ValueError
    saying what is wrong with it if it is not an https URL odal can keep."""
    if not isinstance(value, str):
        raise ValueError("must be a string")
    value = value.strip()
    if len(value) > MAX_UPI_LENGTH:
        raise ValueError(f"must be at most {MAX_UPI_LENGTH} characters")
    if problem := unstorable(value):
        raise ValueError(problem)
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters")
    try:
        _https(value)
        parts = urlsplit(value)
        port = parts.port  # ValueError when out of range
        host = parts.hostname or ""  # lower case, an IPv6 address without its brackets
        if not host.isascii():
            host = host.encode("idna").decode("ascii")
    except (ValidationError, ValueError):
        raise ValueError("must be an https URL, for example a GS1 Digital Link") from None
    userinfo = parts.netloc.rpartition("@")[0]
    canonical = "https://{}{}{}{}{}{}".format(
        f"{userinfo}@" if userinfo else "",
        f"[{host}]" if ":" in host else host,
        f":{port}" if port is not None and port != DEFAULT_PORT else "",
        _escaped(parts.path) or "/",
        f"?{_escaped(parts.query)}" if parts.query else "",
        f"#{_escaped(parts.fragment)}" if parts.fragment else "",
    )
    if len(canonical) > MAX_UPI_LENGTH:
        raise ValueError(f"must be at most {MAX_UPI_LENGTH} characters in its canonical form")
    return canonical


def _escaped(text: str) -> str:
    """`text` (a path, query or fragment) with its percent-encoding normalised."""

    def one(match: re.Match) -> str:
        if match.group(1) is not None:
            char = chr(int(match.group(1), 16))
            return char if char in _UNRESERVED else f"%{match.group(1).upper()}"
        if match.group() == "%":
            raise ValueError("has a % that does not start an escape such as %2F (write a % sign as %25)")
        return "".join(f"%{byte:02X}" for byte in match.group().encode())

    return _ESCAPE.sub(one, text)


def upi_key(value: str) -> str:
    """What UPIs are compared by: the canonical form, or, for a spelling that is not a UPI odal
    could keep, the text as it is. Two spellings name one UPI when their keys are equal."""
    try:
        return canonical_upi(value)
    except ValueError:
        return value


# -- stored UPIs ---------------------------------------------------------------------------------


@dataclass
class Canonicalisation:
    """What canonicalise_upis did: rows rewritten, and rows left as they were."""

    # (id, from, to); canonical form: [(id, upi, status), ...]; (id, upi, why)
    rewritten: list[tuple[str, str, str]] = field(default_factory=list)
    collisions: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    invalid: list[tuple[str, str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{len(self.rewritten)} passport UPI(s) rewritten in canonical form."]
        out += [f"  {pk}: {old} -> {new}" for pk, old, new in self.rewritten]
        if self.collisions:
            out.append(
                f"{len(self.collisions)} UPI(s) are held by more than one passport once spelt canonically; "
                "those passports were left unchanged (see docs/runbook.md, 'UPIs'):"
            )
            for canonical, rows in self.collisions.items():
                out.append(f"  {canonical}")
                out += [f"    passport {pk} ({status}): {upi}" for pk, upi, status in rows]
        if self.invalid:
            out.append(f"{len(self.invalid)} passport UPI(s) are not valid UPIs and were left unchanged:")
            out += [f"  passport {pk}: {upi!r} {why}" for pk, upi, why in self.invalid]
        return out


def canonicalise_upis(apps) -> Canonicalisation:
    """Rewrite every stored UPI in its canonical form, with an audit entry for each; a UPI whose
    canonical form another passport holds (or shares with another) is not rewritten, nor are the
    others of its group: the report names them, for a person to decide which passport is the
    product's. `apps`: a migration's app registry, or django.apps.apps."""
    Passport = apps.get_model("odal", "Passport")
    AuditEntry = apps.get_model("odal", "AuditEntry")
    report = Canonicalisation()
    spellings = defaultdict(list)  # canonical form -> rows spelling it otherwise
    for pk, upi, status in (
        Passport.objects.order_by("created_at", "pk").values_list("pk", "upi", "status").iterator()
    ):
        try:
            canonical = canonical_upi(upi)
        except ValueError as exc:
            report.invalid.append((str(pk), upi, str(exc)))
            continue
        if canonical != upi:
            spellings[canonical].append((str(pk), upi, status))
    holders = {}
    canonicals = list(spellings)
    for start in range(0, len(canonicals), 500):
        rows = Passport.objects.filter(upi__in=canonicals[start : start + 500]).values_list(
            "pk", "upi", "status"
        )
        holders.update({upi: (str(pk), upi, status) for pk, upi, status in rows})
    for canonical, rows in spellings.items():
        if canonical in holders or len(rows) > 1:
            report.collisions[canonical] = [*([holders[canonical]] if canonical in holders else []), *rows]
            continue
        pk, upi, _ = rows[0]
        try:
            with transaction.atomic():
                took = Passport.objects.filter(pk=pk, upi=upi).update(upi=canonical)
        except IntegrityError:  # a passport created meanwhile holds the canonical spelling
            report.collisions[canonical] = rows
            continue
        if took:
            AuditEntry.objects.create(
                actor="system",
                action="passport_upi_canonicalised",
                object_type="odal.passport",
                object_id=pk,
                reason="UPIs are stored in their canonical form",
                details={"from": upi, "to": canonical},
            )
            report.rewritten.append((pk, upi, canonical))
    return report
