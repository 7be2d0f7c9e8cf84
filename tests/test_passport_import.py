"""`odal passport import FILE [--publish]` (issue 16, item 1): CSV or JSON lines, a batch per
transaction through the same intake as POST dpp/bulk, a problem line per row refused (named by its
line), a summary, safe to run again; concurrent imports of overlapping files create each passport
once; a batch the database aborts as a deadlock victim is run again; a batch kicks the drain once
and wakes the sweep once (and their kicks coalesce into one django-q2 task each)."""

import io
import json
import os
import threading
import time

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test import TestCase
from django_q.models import OrmQ

from odal.core.models import AuditEntry, Passport
from odal.surfaces import bulk
from outbox.models import Event
from registry.models import Registration
from tests.factories import ConsumerFactory
from tests.test_bulk_api import refuse_upis

UPI = "https://id.example.eu/01/09506000134352/21/IMP-{}"


def line(n, **extra) -> str:
    return json.dumps({"upi": UPI.format(n), "operatorId": "OP-1", **extra})


def raw(n, rest: str) -> str:
    """A JSON line written by hand (what json.dumps would not write)."""
    return '{"upi": "' + UPI.format(n) + '", ' + rest + "}"


def run(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("passport", "import", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def refused(*args) -> tuple[CommandError, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("passport", "import", *args, stdout=out, stderr=err)
    return caught.value, out.getvalue(), err.getvalue()


def summary(out: str) -> str:
    return out.strip().splitlines()[-1].split(": ", 1)[1].split("): ", 1)[1]


@pytest.mark.django_db
def test_import_publishes_each_passport_and_a_rerun_reports_them_all_as_existing(tmp_path):
    ConsumerFactory(event_types=["passport.*"])
    path = tmp_path / "line.jsonl"
    path.write_text(
        "\n".join([line(1), "", line(2, data={"capacityKwh": 75}), line(3), line(4), line(5)]) + "\n"
    )

    out, err = run(str(path), "--publish", "--actor", "ops", "--batch", "2")
    assert out.strip().startswith(f"{path}: 5 rows in ")
    assert summary(out) == "5 created, 5 published, 0 existing, 0 refused."
    assert err == ""
    assert Passport.objects.filter(status="published").count() == Registration.objects.count() == 5
    assert Event.objects.filter(type="passport.published").count() == 5
    assert set(AuditEntry.objects.values_list("actor", "action")) == {
        ("cli:ops", "passport_created"),
        ("cli:ops", "passport_published"),
    }
    assert AuditEntry.objects.count() == 10
    assert Passport.objects.get(upi=UPI.format(2)).data == {"capacityKwh": 75}

    out, err = run(str(path), "--publish")  # safe to run again: nothing made twice, exit 0
    assert summary(out) == "0 created, 0 published, 5 existing, 0 refused."
    ids = dict(Passport.objects.values_list("upi", "pk"))
    assert err.splitlines() == [
        f"line {n}: A passport with this upi already exists: passport {ids[UPI.format(k)]}."
        for n, k in [(1, 1), (3, 2), (4, 3), (5, 4), (6, 5)]
    ]
    assert Passport.objects.count() == Registration.objects.count() == Event.objects.count() == 5
    assert AuditEntry.objects.count() == 10


@pytest.mark.django_db
def test_csv_rows_are_checked_one_by_one_and_named_by_their_line(tmp_path):
    path = tmp_path / "passports.csv"
    path.write_text(
        "UPI,operator_id,Facility ID,commodityCode,data\n"  # header names: any case, _ - and spaces ignored
        f'{UPI.format(1)},OP-1,FAC-1,8507 60,"{{""capacityKwh"": 75}}"\n'  # 2
        f'{UPI.format(2)},OP-1,"two\nlines",,\n'  # 3-4: a control character in facilityId
        f"{UPI.format(3)},OP-1,,,not json\n"  # 5
        f"{UPI.format(4)},OP-1,,,[1]\n"  # 6
        f"{UPI.format(5)},OP-1,,,,extra\n"  # 7
        f"http://id.example.eu/01/6,OP-1\n"  # 8 (fewer cells: the rest empty)
        ",,,,\n"  # 9 (blank: skipped)
        f"{UPI.format(1).replace('IMP', 'imp')},OP-2\n"  # 10: not a repeat (the path keeps its case)
        f"{UPI.format(1).replace('https://id.', 'HTTPS://ID.')},OP-2\n"  # 11: a repeat of line 2
        f"{UPI.format(7)},OP-7\n"  # 12
    )
    error, out, err = refused(str(path))
    assert error.returncode == 1 and "5 of 9 rows were refused" in str(error)
    assert summary(out) == "3 created, 0 published, 1 existing, 5 refused."
    first = Passport.objects.get(upi=UPI.format(1))
    assert err.splitlines() == [
        "line 3: This passport is not valid. facilityId: must not contain control characters (a line break, "
        "a tab or an escape).",
        'line 5: This passport is not valid. data: must be a JSON object, e.g. {"capacityKwh": 75}.',
        "line 6: This passport is not valid. data: Input should be a valid dictionary.",
        "line 7: This row has 6 cells; the header names 5 columns.",
        "line 8: This passport is not valid. upi: must be an https URL, for example a GS1 Digital Link.",
        f"line 11: This upi is also line 2: passport {first.pk}.",
    ]
    assert first.data == {"capacityKwh": 75} and (first.facility_id, first.commodity_code) == (
        "FAC-1",
        "8507 60",
    )
    assert Passport.objects.get(upi=UPI.format(7)).facility_id == ""
    assert Passport.objects.count() == 3


@pytest.mark.django_db
def test_a_file_that_cannot_be_read_is_refused_and_bad_arguments_are_usage_errors(tmp_path):
    (tmp_path / "unknown.csv").write_text("upi,operatorId,colour\n")
    (tmp_path / "no-operator.csv").write_text("upi,data\n")
    (tmp_path / "twice.csv").write_text("upi,operatorId,operator_id\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.csv")  # (no writer: opening it to read would wait forever)
    for name, says in [
        ("missing.jsonl", "cannot be read: No such file or directory"),
        ("unknown.csv", "the header names a column odal does not know, 'colour'"),
        ("no-operator.csv", "has no operatorId column"),
        ("twice.csv", "names the column operatorId twice"),
        ("empty.csv", "has no header row"),
        (".", "cannot be read"),
        # never-ending or never-answering: refused before a byte is read
        ("/dev/zero", "is not a regular file"),
        ("zero.jsonl", "is not a regular file"),
        ("fifo.csv", "is not a regular file"),
    ]:
        error, out, _ = refused(str(tmp_path / name))
        assert error.returncode == 1 and says in str(error), (name, str(error))
    for args in (["--batch", "0"], ["--batch", "1001"], ["--actor", " "], []):
        error, _, _ = refused(*args, *([] if not args else [str(tmp_path / "empty.csv")]))
        assert error.returncode == 2, args
    assert not Passport.objects.exists()


@pytest.mark.django_db
def test_hostile_lines_are_refused_alone(tmp_path):
    path = tmp_path / "hostile.jsonl"
    lines = [
        line(1),
        raw(2, '"operatorId": "OP\\u0000"'),
        raw(3, '"operatorId": "OP", "data": {"\\ud800": 1}'),
        raw(4, '"operatorId": "OP", "data": ' + "[" * 70 + "]" * 70),
        raw(5, '"operatorId": "OP", "data": {"x": NaN}'),
        raw(6, '"operatorId": "OP", "data": {"x": 1e400}'),
        raw(7, '"operatorId": ')[:-1],  # cut short
        "[1, 2]",  # 8
        "[" * 100_000 + "]" * 100_000,  # 9
        line(10),
    ]
    path.write_bytes("\n".join(lines).encode() + b"\n" + b'{"upi": "\xff\xfe", "operatorId": "OP"}\n')
    error, out, err = refused(str(path))
    assert summary(out) == "2 created, 0 published, 0 existing, 9 refused."
    problems = dict(text.split(": ", 1) for text in err.splitlines())
    assert problems == {
        "line 2": "This passport is not valid. operatorId: contains the NUL character (\\u0000), which cannot be "
        "stored.",
        "line 3": "This passport is not valid. data.\ufffd: has a key that contains a lone surrogate (\\ud800), "
        "which cannot be stored.",
        "line 4": problems["line 4"],
        "line 5": "This passport is not valid. data.x: is NaN, which is not a number JSON can carry.",
        "line 6": "This passport is not valid. data.x: is the number 1e400, which is too large to store.",
        "line 7": problems["line 7"],
        "line 8": "This line is not a JSON object: each line is one passport, {…}.",
        "line 9": "This passport is not valid. body: is nested more than 64 levels deep.",
        "line 11": "This line is not UTF-8 text.",
    }
    assert problems["line 7"].startswith("This line is not JSON (")
    assert problems["line 4"].startswith("This passport is not valid. data[0][0]")
    assert problems["line 4"].endswith(": is nested more than 64 levels deep.")
    assert set(Passport.objects.values_list("upi", flat=True)) == {UPI.format(1), UPI.format(10)}


@pytest.mark.django_db
def test_the_json_summary_lists_every_problem(tmp_path):
    path = tmp_path / "rows.ndjson"
    path.write_text(line(1) + "\n" + '{"upi": "x"}\n')
    error, out, err = refused(str(path), "--json", "--publish")
    report = json.loads(out)
    assert {k: report[k] for k in ("rows", "created", "published", "existing", "refused")} == {
        "rows": 2,
        "created": 1,
        "published": 1,
        "existing": 0,
        "refused": 1,
    }
    assert report["seconds"] >= 0 and report["file"] == str(path)
    [problem] = report["problems"]
    assert problem["line"] == 2 and problem["error"]["code"] == "invalid_request"
    assert err == "" and "1 of 2 rows were refused" in str(error)  # no problem lines beside the JSON


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.django_db
def test_a_terminal_sees_a_progress_bar(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(line(n) + "\n" for n in range(5)))
    out = Terminal()
    call_command("passport", "import", str(path), "--batch", "2", stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    assert "\r[" in text and "100%" in text and "5 of 5 rows" in text
    assert text.rstrip().endswith("5 created, 0 published, 0 existing, 0 refused.")


@pytest.mark.django_db
def test_a_batch_the_database_refuses_fails_only_its_own_rows(tmp_path):
    refuse_upis()
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(line(n) + "\n" for n in [1, 2, "REFUSED", 4, 5]))
    error, out, err = refused(str(path), "--batch", "2", "--publish")
    assert summary(out) == "3 created, 3 published, 0 existing, 2 refused."
    assert [text.split(":")[0] for text in err.splitlines()] == ["line 3", "line 4"]
    assert "The database refused the batch of 2 passports" in err and "Safe to try again" in err
    refuse_upis(False)
    out, _ = run(str(path), "--batch", "2", "--publish")
    assert summary(out) == "2 created, 2 published, 3 existing, 0 refused."
    assert Passport.objects.count() == Registration.objects.count() == 5


@pytest.mark.django_db
def test_each_batch_kicks_the_drain_once_and_wakes_the_sweep_once(tmp_path, settings):
    settings.ODAL_KICK_SWEEP = True
    ConsumerFactory(event_types=["passport.*"])
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(line(n) + "\n" for n in range(250)))
    with TestCase.captureOnCommitCallbacks(execute=True) as callbacks:
        out, _ = run(str(path), "--publish", "--batch", "100")
    assert summary(out) == "250 created, 250 published, 0 existing, 0 refused."
    assert len(callbacks) == 6  # 3 batches, each one drain kick and one wake of the sweep: not 250
    funcs = [task.func() for task in OrmQ.objects.all()]
    # ... and with nothing listening, the first of each enqueues a task, the later ones find it
    # on its way (odal.work.wake: debounced kicks).
    assert sorted(funcs) == ["outbox.tasks.sweep", "registry.tasks.drain"]


# -- concurrency: real threads, each with its own connection, real commits -----------------------


def import_in_thread(path, results: dict, key: str, start: threading.Barrier, *args) -> threading.Thread:
    def work():
        try:
            start.wait()
            results[key] = run(str(path), "--publish", "--json", *args)[0]
        except CommandError as exc:  # pragma: no cover - reported by the assertions
            results[key] = f"refused: {exc}"
        finally:
            connections.close_all()

    thread = threading.Thread(target=work)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_concurrent_imports_of_overlapping_files_create_each_passport_once(tmp_path):
    ConsumerFactory(event_types=["passport.*"])
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(line(n) + "\n" for n in range(300)))
    second.write_text("".join(line(n) + "\n" for n in reversed(range(150, 450))))  # overlap: 150..299
    results, start = {}, threading.Barrier(2)
    threads = [
        import_in_thread(first, results, "a", start, "--batch", "50"),
        import_in_thread(second, results, "b", start, "--batch", "50"),
    ]
    for thread in threads:
        thread.join(120)
    a, b = json.loads(results["a"]), json.loads(results["b"])
    assert a["refused"] == b["refused"] == 0, (a["problems"][:3], b["problems"][:3])
    assert a["created"] + b["created"] == 450 and a["existing"] + b["existing"] == 150
    assert {p["error"]["code"] for p in a["problems"] + b["problems"]} <= {"upi_taken"}
    assert Passport.objects.count() == Registration.objects.count() == 450
    assert Event.objects.filter(type="passport.published").count() == 450
    assert AuditEntry.objects.count() == 900


def connect(**options) -> psycopg.Connection:
    params = connection.get_connection_params()
    return psycopg.connect(
        **{k: v for k, v in params.items() if k not in ("cursor_factory", "context")}, **options
    )


def waiting_on_a_lock(but: int) -> bool:
    with connect(autocommit=True) as conn:  # (a transaction would read pg_stat_activity once)
        return (
            conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> %s "
                "AND datname = current_database()",
                [but],
            ).fetchone()[0]
            > 0
        )


@pytest.mark.django_db(transaction=True)
def test_a_batch_the_database_aborts_to_break_a_deadlock_is_run_again():
    """Another writer holds UPI b and then wants a, which the batch [a, b] took first: PostgreSQL
    breaks the deadlock by aborting the batch (it waited first, so it checks first). Run again, the
    batch finds both passports the other writer committed."""
    a, b = UPI.format("A"), UPI.format("B")
    other = connect()
    other.execute(
        "SET deadlock_timeout = '10s'"
    )  # the batch (1 s) checks for the cycle first, however slow this is
    insert = (
        "INSERT INTO odal_passport (id, upi, operator_id, facility_id, commodity_code, data, status, created_at, "
        "updated_at) VALUES (gen_random_uuid(), %s, 'OP-9', '', '', '{}', 'draft', now(), now())"
    )
    other.execute(insert, [b])
    pid = other.execute("SELECT pg_backend_pid()").fetchone()[0]
    got = {}

    def intake():
        try:
            got["results"] = bulk.Intake(actor="test", publish=True).take(
                [(0, {"upi": a, "operatorId": "OP"}), (1, {"upi": b, "operatorId": "OP"})]
            )
        finally:
            connections.close_all()  # fmt: skip

    thread = threading.Thread(target=intake)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not waiting_on_a_lock(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        other.execute(insert, [a])  # the cycle: PostgreSQL aborts the batch, which waited first
        other.commit()
    finally:
        other.close()
        thread.join(30)
    assert [r.error["code"] for r in got["results"]] == ["upi_taken", "upi_taken"]
    assert list(Passport.objects.order_by("upi").values_list("upi", "operator_id")) == [
        (a, "OP-9"),
        (b, "OP-9"),
    ]
    assert not Registration.objects.exists() and not AuditEntry.objects.exists()
