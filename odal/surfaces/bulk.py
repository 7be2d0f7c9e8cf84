"""Bulk intake: new passports by the thousand, created and, if asked, published, a batch at a time
(`POST dpp/bulk`, `odal passport import`).

Each passport means exactly what `POST dpp` and then `POST dpp/{id}/publish` mean for it:
- the same input rules (odal.core.schemas.PassportIn: the canonical UPI, 422 `invalid_request` naming
  the field), and a UPI that is taken is refused (`upi_taken`), naming the passport holding it;
- created: the passport and its `passport_created` audit entry;
- published: status published, the registration (pending, due now: registry.service.on_publish),
  the `passport_published` audit entry saying so, the `passport.published` event and its
  deliveries.

Each batch (at most 1,000 passports) is one transaction, written set-based: one INSERT of the
passports (`ON CONFLICT DO NOTHING`: the unique constraint on the UPI decides, so a passport that
another intake created meanwhile is reported as taken, never made twice), one of the audit
entries, one of the registrations, one of the events, one of the deliveries; and, once it
commits, one kick of the drain and one wake of the sweep. The passports go in ordered by UPI, so
two intakes of overlapping files wait for each other instead of deadlocking; a batch the database
aborts anyway (a deadlock victim, a serialization failure) is run again, up to RUNS times.

An item refused (bad input, a UPI taken or given twice) fails alone. A batch the database refuses
fails its own items, each with an error saying so (`batch_failed`), and the next batch goes on.
"""

import csv
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone
from pydantic import ValidationError

from odal.core import reconnect, rules
from odal.core.errors import Refused
from odal.core.middleware import checked_json
from odal.core.models import AuditEntry, Passport
from odal.core.rows import insert_rows
from odal.core.schemas import PassportIn, invalid_request
from odal.core.text import MAX_JSON_DEPTH, error_text, find_unstorable, storable
from odal.surfaces.lifecycle import passport_event
from outbox.events import emit_many
from registry import service as registry

log = logging.getLogger(__name__)

MAX_ITEMS = rules.BULK[1]  # passports per request, and per transaction
RUNS = 3  # tries of a batch the database aborted to break a deadlock or a serialization failure
RETRYABLE = ("40P01", "40001")  # deadlock_detected, serialization_failure
TAKEN = ("upi_taken", "upi_repeated")  # the passport exists: what a rerun of an import reports


@dataclass
class ItemResult:
    """What became of one item: `id` of the passport it created, or `error` ({detail, code, …},
    the API's error shape) saying why it created none."""

    index: int  # its place in the request (from 0), or its line in the file
    id: uuid.UUID | None = None
    error: dict | None = None
    published: bool = False

    @property
    def existing(self) -> bool:
        """Refused because its UPI's passport exists (before, or from an earlier item)."""
        return self.error is not None and self.error["code"] in TAKEN

    def as_json(self) -> dict:
        out = {"index": self.index}
        if self.id is not None:
            out["id"] = self.id
        if self.error is not None:
            out["error"] = self.error
        return out


def check(raw) -> PassportIn:
    """One item as POST dpp would take it, or Refused (422 invalid_request) naming each field."""
    if isinstance(raw, Refused):  # a line the file reader could not make an item of
        raise raw
    if not isinstance(raw, dict):
        raise Refused(
            'This passport is not valid: an item is a JSON object, {"upi": …, "operatorId": …}.',
            code="invalid_request",
            status=422,
            errors=[{"field": "item", "message": "must be a JSON object"}],
        )
    try:
        return PassportIn.model_validate(raw)
    except ValidationError as exc:
        body = invalid_request(exc.errors(), "This passport is not valid.")
        raise Refused(body["detail"], code=body["code"], status=422, errors=body["errors"]) from None


@dataclass
class Intake:
    """One bulk intake (a request, a file), a batch at a time. It remembers the UPIs it was given,
    so a UPI given twice is refused the second time (`upi_repeated`), naming the first."""

    actor: str  # who, for the audit trail
    publish: bool
    item: str = "item"  # what an index is, in sentences: "item" (of a request) or "line"
    seen: dict[str, int] = field(default_factory=dict)  # UPI -> the index that first gave it
    holders: dict[str, uuid.UUID] = field(default_factory=dict)  # UPI -> its passport, once known

    def take(self, items: list, batch: int = MAX_ITEMS) -> list[ItemResult]:
        """Every item of `items` (a list of (index, item)), a transaction per `batch`."""
        results = []
        for start in range(0, len(items), batch):
            results += self.batch(items[start : start + batch])
        return results

    def batch(self, items: list) -> list[ItemResult]:
        """One transaction's worth of (index, item): their results, in order."""
        results: dict[int, ItemResult] = {}
        fresh, repeats = [], []
        for index, raw in items:
            try:
                passport = check(raw)
            except Refused as exc:
                results[index] = ItemResult(index, error=exc.as_json())
                continue
            if passport.upi in self.seen:
                repeats.append((index, passport.upi))
            else:
                self.seen[passport.upi] = index
                fresh.append((index, passport))
        if fresh:
            results.update(self._write(fresh))
        for index, upi in repeats:
            results[index] = self._repeated(index, upi)
        return [results[index] for index, _ in items]

    def _repeated(self, index: int, upi: str) -> ItemResult:
        first, holder = self.seen[upi], self.holders.get(upi)
        if holder is None:
            return _taken(
                index, "upi_repeated", f"This upi is also {self.item} {first}, which created no passport."
            )
        return _taken(
            index, "upi_repeated", f"This upi is also {self.item} {first}: passport {holder}.", holder
        )

    def _write(self, fresh: list) -> dict[int, ItemResult]:
        """The batch's transaction, run again if the database aborted it to break a deadlock; the
        batch's results, or each item's `batch_failed` if the database refused it."""
        run = 1
        while True:
            try:
                with transaction.atomic():
                    results, holders = self._insert(fresh)
                self.holders.update(holders)
                return results
            except DatabaseError as exc:
                if reconnect.is_lost(exc):
                    raise  # not this batch's fault: the command or request stops, saying so
                if run < RUNS and getattr(exc.__cause__, "sqlstate", None) in RETRYABLE:
                    log.info("bulk intake: the database aborted a batch (%s); running it again", exc)
                    run += 1
                    continue
                log.warning(
                    "bulk intake: the database refused a batch of %s passports", len(fresh), exc_info=True
                )
                error = {
                    "detail": f"The database refused the batch of {len(fresh):,} passports this one was in "
                    f"({' '.join(error_text(exc).split())}); none of them was created. Safe to try again.",
                    "code": "batch_failed",
                }
                return {index: ItemResult(index, error=error) for index, _ in fresh}

    def _insert(self, fresh: list) -> tuple[dict[int, ItemResult], dict[str, uuid.UUID]]:
        """The batch's writes (see the module's docstring), inside its transaction: the results,
        and the passport of each UPI."""
        now = timezone.now()
        status = Passport.Status.PUBLISHED if self.publish else Passport.Status.DRAFT
        fresh = sorted(fresh, key=lambda item: item[1].upi)  # one order for every intake
        rows = [
            {
                "id": uuid.uuid4(),
                "upi": p.upi,
                "operator_id": p.operatorId,
                "facility_id": p.facilityId or "",
                "commodity_code": p.commodityCode or "",
                "data": p.data or {},
            }
            for _, p in fresh
        ]
        made = insert_rows(
            Passport,
            rows,
            same={
                "status": status,
                "created_at": now,
                "updated_at": now,
                "published_at": now if self.publish else None,
            },
            ignore_conflicts=True,
        )
        created = [row for row in rows if row["id"] in made]
        taken = [row["upi"] for row in rows if row["id"] not in made]
        holders = dict(Passport.objects.filter(upi__in=taken).values_list("upi", "pk")) if taken else {}
        entries = [("passport_created", row["id"], {}) for row in created]
        if self.publish and created:
            outcome = registry.on_publish_new([row["id"] for row in created]).sentence
            entries = [
                entry
                for row in created
                for entry in (
                    ("passport_created", row["id"], {}),
                    ("passport_published", row["id"], {"registry": outcome}),
                )
            ]
            emit_many(
                "passport.published",
                [
                    passport_event(NewPassport(row["id"], row["upi"], row["operator_id"], status))
                    for row in created
                ],
            )
        AuditEntry.objects.record_each(entries, actor=self.actor, model=Passport)
        results = {}
        for (index, _), row in zip(fresh, rows, strict=True):
            if row["id"] in made:
                results[index] = ItemResult(index, id=row["id"], published=self.publish)
            elif holder := holders.get(row["upi"]):
                results[index] = _taken(
                    index, "upi_taken", f"A passport with this upi already exists: passport {holder}.", holder
                )
            else:  # (deleted again since: it held the UPI when this batch was written)
                results[index] = _taken(index, "upi_taken", "A passport with this upi already exists.")
        return results, {**holders, **{row["upi"]: row["id"] for row in created}}


def _taken(index: int, code: str, detail: str, holder: uuid.UUID | None = None) -> ItemResult:
    error = {"detail": detail, "code": code, **({"dppId": holder} if holder else {})}
    return ItemResult(index, error=error)


class NewPassport(NamedTuple):
    """What passport_event() reads of a passport, for one a batch made."""

    pk: uuid.UUID
    upi: str
    operator_id: str
    status: str


# -- files -----------------------------------------------------------------------------------------

# A CSV file's header names these columns (any case; `_`, `-` and spaces ignored: operator_id is
# operatorId); upi and operatorId are required. `data` holds a JSON object.
COLUMNS = ("upi", "operatorId", "facilityId", "commodityCode", "data")
REQUIRED = ("upi", "operatorId")
JSON_LINES = (".jsonl", ".ndjson", ".json")


def _column(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in "_- ")


KNOWN = {_column(name): name for name in COLUMNS}


def _malformed(detail: str) -> Refused:
    return Refused(detail, code="malformed_line", status=422)


def _unstorable(field: str, problem: str) -> Refused:
    return Refused(
        f"This passport is not valid. {field}: {problem}.",
        code="invalid_request",
        status=422,
        errors=[{"field": field, "message": problem}],
    )


def screened(raw):
    """An item of `POST dpp/bulk` as the API's boundary would check a body (it leaves the items to
    this, so that one fails alone): the item, or Refused naming what PostgreSQL cannot store in
    it (NUL, a lone surrogate) or nesting too deep (counted from the body: it is two levels in)."""
    problem = find_unstorable(raw, depth=2, max_depth=MAX_JSON_DEPTH)
    if problem is None:
        return raw
    where, why = problem
    return _unstorable("item" if where == "body" else where, why)


def _not_utf8(text: str) -> bool:
    """Read with errors="surrogateescape": bytes that are not UTF-8 came in as lone surrogates."""
    return any("\udc80" <= ch <= "\udcff" for ch in text)


NEWLINES = ("\n", "\r")
SKIP_CHARS = 1024 * 1024  # a line too long is skipped this much at a time


def _lines(f) -> Iterator[tuple[int, str | None]]:
    """(line number, the line) of a text file opened with newline="", each line read only up to
    ODAL_MAX_BODY_BYTES: a longer one (in UTF-8) comes as None, the rest of it skipped unread, so a
    file of one endless line is never held in memory whole."""
    limit = settings.ODAL_MAX_BODY_BYTES
    number, after_cr = 0, False
    while line := f.readline(limit + 1):
        if after_cr and line == "\n":  # the \n of a \r\n that a read's size parted from its \r
            after_cr = False
            continue
        number += 1
        if len(line) > limit and not line.endswith(NEWLINES):  # too long: the rest is skipped, unread
            while line and not line.endswith(NEWLINES):
                line = f.readline(SKIP_CHARS)
            after_cr = line.endswith("\r")
            yield number, None
            continue
        after_cr = line.endswith("\r")
        if len(line.rstrip("\r\n").encode("utf-8", "surrogateescape")) > limit:
            yield number, None
        else:
            yield number, line


@dataclass
class PassportFile:
    """A file of passports: JSON lines (one object per line, the keys of POST dpp) or CSV (a header
    row naming COLUMNS). Read a row at a time, so its size does not matter."""

    path: Path
    kind: str  # "jsonl" or "csv"
    columns: list[str] = field(default_factory=list)  # a CSV file's, in the header's order

    @classmethod
    def open(cls, name: str) -> "PassportFile":
        """The file, or Refused (exit 1) saying why it cannot be read or what is wrong with its header."""
        path = Path(name)
        try:
            # A file, not a device, a pipe or a socket: /dev/zero never ends (its one endless line
            # was held whole, or skipped forever) and a pipe with no writer never answers.
            if path.exists() and not path.is_dir() and not path.is_file():
                raise Refused(
                    f"{name} is not a regular file (a device, a pipe or a socket); odal imports files.",
                    code="unreadable",
                )
            with path.open("rb") as f:
                start = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
        except OSError as exc:
            raise Refused(f"{name} cannot be read: {exc.strerror or exc}.", code="unreadable") from None
        is_json = path.suffix.lower() in JSON_LINES or (path.suffix.lower() != ".csv" and start[:1] == b"{")
        source = cls(path, "jsonl" if is_json else "csv")
        if not is_json:
            source.columns = source._header()
        return source

    def _open(self):
        return self.path.open(encoding="utf-8-sig", errors="surrogateescape", newline="")

    def _header(self) -> list[str]:
        try:
            with self._open() as f:
                header = next(csv.reader(f), None)
        except csv.Error as exc:  # e.g. a cell over the csv module's field limit
            raise Refused(
                f"{self.path}: the header row cannot be read as CSV ({storable(exc, 200)}); a CSV file's "
                f"first row names its columns ({', '.join(COLUMNS)}).",
                code="unreadable",
            ) from None
        if not header or not any(cell.strip() for cell in header):
            raise Refused(
                f"{self.path} has no header row: a CSV file's first row names its columns "
                f"({', '.join(COLUMNS)}).",
                code="unreadable",
            )
        columns = []
        for cell in header:
            name = KNOWN.get(_column(cell))
            if name is None:
                raise Refused(
                    f"{self.path}: the header names a column odal does not know, {rules.shown(cell)}; "
                    f"the columns are {', '.join(COLUMNS)}.",
                    code="unreadable",
                )
            if name in columns:
                raise Refused(f"{self.path}: the header names the column {name} twice.", code="unreadable")
            columns.append(name)
        missing = [name for name in REQUIRED if name not in columns]
        if missing:
            raise Refused(
                f"{self.path}: the header has no {' and no '.join(missing)} column (required).",
                code="unreadable",
            )
        return columns

    def count(self) -> int:
        """How many rows it holds (for the progress bar)."""
        try:
            with self._open() as f:
                if self.kind == "jsonl":
                    return sum(1 for _, line in _lines(f) if line is None or line.strip())
                return max(0, sum(1 for record in csv.reader(f) if any(c.strip() for c in record)) - 1)
        except (OSError, csv.Error):
            return 0  # the rows themselves say what is wrong

    def rows(self) -> Iterator[tuple[int, dict | Refused]]:
        """(line number, the row as POST dpp's body, or Refused saying why it is none)."""
        csv.field_size_limit(max(csv.field_size_limit(), settings.ODAL_MAX_BODY_BYTES))
        try:
            with self._open() as f:
                yield from self._json_lines(f) if self.kind == "jsonl" else self._csv_rows(f)
        except OSError as exc:
            raise Refused(
                f"{self.path} could not be read to the end: {exc.strerror or exc}.", code="unreadable"
            ) from None

    def _json_lines(self, f):
        limit = settings.ODAL_MAX_BODY_BYTES
        for number, line in _lines(f):
            if line is None:
                yield (
                    number,
                    _malformed(
                        f"This line is longer than {limit:,} bytes (ODAL_MAX_BODY_BYTES), the largest "
                        "passport POST dpp takes; it was not read."
                    ),
                )
                continue
            if not line.strip():
                continue
            if _not_utf8(line):
                yield number, _malformed("This line is not UTF-8 text.")
                continue
            try:
                value, problem = checked_json(line)
            except ValueError as exc:
                yield number, _malformed(f"This line is not JSON ({storable(exc, 200)}).")
                continue
            if problem is not None:
                yield number, _unstorable(*problem)
            elif not isinstance(value, dict):
                yield number, _malformed("This line is not a JSON object: each line is one passport, {…}.")
            else:
                yield number, value

    def _csv_rows(self, f):
        reader = csv.reader(f)
        ended = 0  # the line the previous record ended on
        try:
            next(reader, None)  # the header (checked by open)
            ended = reader.line_num
            for record in reader:
                number, ended = ended + 1, reader.line_num
                if not any(cell.strip() for cell in record):
                    continue
                yield number, self._csv_row(record)
        except csv.Error as exc:
            yield (
                ended + 1,
                _malformed(
                    f"The file is not valid CSV from this line on ({storable(exc, 200)}); the rest was not read."
                ),
            )

    def _csv_row(self, record: list[str]) -> dict | Refused:
        if len(record) > len(self.columns):
            return _malformed(
                f"This row has {len(record)} cells; the header names {len(self.columns)} columns."
            )
        if any(_not_utf8(cell) for cell in record):
            return _malformed("This row is not UTF-8 text.")
        row = {}
        for name, cell in zip(self.columns, record, strict=False):
            if name == "data":
                if not cell.strip():
                    continue
                try:
                    value, problem = checked_json(cell)
                except ValueError:
                    return _unstorable("data", 'must be a JSON object, e.g. {"capacityKwh": 75}')
                if problem is not None:
                    where, why = problem
                    return _unstorable("data" if where == "body" else f"data.{where}", why)
                row["data"] = value
            elif cell or name in REQUIRED:  # an empty optional cell: not given
                row[name] = cell  # (the rules refuse what PostgreSQL cannot store)
        return row
