"""Log lines a machine can read: with ODAL_LOG_FORMAT=json each record is one JSON object on one line.

Keys: ``time`` (ISO 8601 UTC), ``level``, ``logger``, ``message``, each of IDS that the call
passed in ``extra`` (``log.warning("…", extra={"delivery": d.pk, "claim": token})``), and ``exc``
with the traceback when there is one. The line is ASCII: a NUL is escaped (``\\u0000``), a lone
surrogate becomes U+FFFD (strict JSON parsers refuse it even escaped), and an id that is not a
whole number (a UUID, a model) is written as its text.
"""

import json
import logging
import re
from datetime import UTC, datetime

from odal.core.redact import redacted_urls_in

IDS = ("delivery", "consumer", "claim", "registration", "attempt", "event")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value) -> str:
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception as exc:  # a hostile __str__ must not cost the line
        text = f"<unprintable {type(value).__name__}: {type(exc).__name__}>"
    return _SURROGATE.sub("\ufffd", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": _text(record.getMessage()),
        }
        for key in IDS:
            if key in record.__dict__:
                value = record.__dict__[key]
                whole = isinstance(value, int) and not isinstance(value, bool)
                line[key] = value if whole or value is None else _text(value)
        if record.exc_text:  # (RedactUrls made it, without credentials)
            line["exc"] = _text(record.exc_text)
        elif record.exc_info:
            line["exc"] = _text(self.formatException(record.exc_info))
        if record.stack_info:
            line["stack"] = _text(self.formatStack(record.stack_info))
        return json.dumps(line, ensure_ascii=True, default=str)


class RedactUrls(logging.Filter):
    """Every line odal's console handler writes, with the credentials of any URL in it (its
    whole userinfo, its path parameters' and query values) shown as *** (odal.core.redact): a log is read by more
    people than may see a webhook's URL whole. The message is formatted here, once, and the
    traceback too (as logging.Formatter would, then cached in exc_text, which formatters use)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = _text(record.getMessage())
        hidden = redacted_urls_in(message)
        if hidden != message:
            record.msg, record.args = hidden, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redacted_urls_in(logging.Formatter().formatException(record.exc_info))
        return True


class LostDatabaseInALine(logging.Filter):
    """django-q2 logs a database it cannot reach (its pusher's poll, its monitor's save) with the
    whole traceback, every poll while it is gone, as it would a bug. A lost connection
    (odal.core.reconnect.is_lost) is not one: its record says what happened in one line, as odal's
    own workers do, and django-q2 goes on retrying as before. Any other error keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from odal.core import reconnect  # (as it runs: logging is set up from the settings, before Django is)

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, reconnect.ERRORS) and reconnect.is_lost(exc):
            record.msg, record.args = f"{_text(record.getMessage())}: {reconnect.lost_in_a_line(exc)}", None
            record.exc_info = record.exc_text = None
        return True
