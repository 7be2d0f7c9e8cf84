"""Credentials in URLs, hidden from whoever need not see them.

A webhook URL may carry credentials: `http://alice:PASSWORD@host/hook;key=K?token=SECRET`. It is
shown whole only to admin scope and to staff who may change consumers (they configure it); everyone
and everything else (read/write scope, Viewers, the audit trail, the logs, the attempt log) sees
its whole userinfo, every path parameter's value and every query value as ***:
`http://***@host/hook;key=***?token=***`. The whole userinfo, not only a password: the client
sends `alice%3APASSWORD@` as Basic `alice:PASSWORD:`, and a user name alone may be an API key
(`https://sk_live_…@host/`). `redacted_url` is the one function that hides them; the sweep keeps
calling the whole URL.
"""

import base64
import functools
import re
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

HIDDEN = "***"
# A URL inside free text (an error message, a log line): a scheme, ://, then up to the first
# whitespace or quote. Whatever follows it in the text is left as it is.
# The scheme bounded (no scheme is longer than 32 characters): unbounded, a long run of letters
# without "://" was tried from each of its letters to its end, time growing as its square (100,000
# letters in an answer or an error took 25 s to redact for a Viewer's page).
URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s'\"<>`]+")


def redacted_url(url: str) -> str:
    """`url` with its whole userinfo, the value of every path parameter (`;name=value`, in any
    segment) and of every query parameter (and a fragment, which may carry a token too) shown as
    ***; the scheme, host, port, path, parameter names and query keys stay, so a person still
    recognises the URL. A URL that cannot be read at all is shown as *** whole."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:  # e.g. an unbalanced [ in the host
        return HIDDEN
    # Everything before the host's @ (the last one: a raw @ in a password comes before it).
    _userinfo, at, host = netloc.rpartition("@")
    if at:
        netloc = f"{HIDDEN}@{host}"
    path = "/".join(_hidden_parameters(segment) for segment in parts.path.split("/"))
    query = "&".join(_hidden_value(item) for item in parts.query.split("&")) if parts.query else ""
    fragment = HIDDEN if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, path, query, fragment))


def _hidden_parameters(segment: str) -> str:
    """A path segment with the value of each of its parameters (`a;token=SECRET;v=2`) hidden."""
    name, *parameters = segment.split(";")
    return ";".join([name, *(_hidden_value(parameter) for parameter in parameters)])


def _hidden_value(item: str) -> str:
    key, equals, _value = item.partition("=")
    # `?SECRET` (or `;SECRET`) alone, no =, is a value without a key: hidden whole.
    return f"{key}={HIDDEN}" if equals else (HIDDEN if key else "")


def redacted_urls_in(text: str) -> str:
    """`text` with every URL in it redacted (see redacted_url): for error messages and log lines,
    which may quote a URL (an HTTP library's error, a redirect's Location)."""
    if not text or "://" not in text:
        return text
    return URL_IN_TEXT.sub(lambda match: redacted_url(match.group()), text)


def redacted_urls_within(value):
    """A JSON value (an audit entry's details) with every URL in its strings redacted."""
    if isinstance(value, str):
        return redacted_urls_in(value)
    if isinstance(value, list):
        return [redacted_urls_within(item) for item in value]
    if isinstance(value, dict):
        return {key: redacted_urls_within(item) for key, item in value.items()}
    return value


# A credential of a URL shorter than this is not looked for in free text: replacing "1" or "true"
# everywhere would garble the text, and a secret that short protects nothing anyway.
SHORTEST_SECRET = 6


@functools.lru_cache(maxsize=1024)
def secrets_of(url: str) -> tuple[str, ...]:
    """The parts of `url` that redacted_url hides (the userinfo and each of its parts, each path
    parameter's and query value, the fragment), raw and percent-decoded, and the Basic
    authorization the webhook client sends for the userinfo, longest first: what must not be
    quoted back in free text either. Kept per URL: a sweep asks for every attempt of the same
    few consumers."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ()
    found = []
    userinfo, at, _host = parts.netloc.rpartition("@")
    if at:
        for form in (userinfo, unquote(userinfo)):  # (`alice%3APASSWORD` reads alice:PASSWORD)
            found += [form, *form.split(":")]
        found.append(_basic(userinfo))
    for segment in parts.path.split("/"):
        found += [_value(parameter) for parameter in segment.split(";")[1:]]
    found += [_value(item) for item in parts.query.split("&")]
    found.append(parts.fragment)
    found += [unquote_plus(value) for value in found]
    return tuple(sorted({v for v in found if len(v) >= SHORTEST_SECRET}, key=len, reverse=True))


def _value(item: str) -> str:
    """A parameter's value (`name=value`), or the whole of one without a name."""
    name, equals, value = item.partition("=")
    return value if equals else name


def _basic(userinfo: str) -> str:
    """HTTP Basic's credentials as the webhook client sends them for `userinfo` (an answer may echo
    the request's headers): user and password read as httpx reads them, split at the first raw
    colon and then percent-decoded (`alice%3APASSWORD` is the user `alice:PASSWORD` and no
    password, sent as `alice:PASSWORD:`), in base64."""
    user, _, password = userinfo.partition(":")
    return base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()


def without_secrets_of(url: str, text: str) -> str:
    """`text` with each credential of `url` (secrets_of) that it quotes (a relative Location, an
    answer echoing the request) shown as ***."""
    if not text:
        return text
    for secret in secrets_of(url):
        text = text.replace(secret, HIDDEN)
    return text


def may_see_whole_urls(request) -> bool:
    """Whether the caller of an API request sees webhook URLs whole: a bearer token of admin scope,
    or a staff session whose user may change consumers (`outbox.change_consumer`)."""
    principal = getattr(request, "auth", None)
    if principal is None:
        return False
    if principal.scope is not None:  # a bearer token: its scope decides
        return principal.scope == "admin"
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.has_perm("outbox.change_consumer"))
