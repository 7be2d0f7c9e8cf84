"""The deliveries' attempt log as the sweep writes it: one COPY of a set's lines."""

from django.db import connection

from outbox.models import DeliveryAttempt

ATTEMPT_COLUMNS = (
    "delivery_id", "number", "claim_token", "started_at", "finished_at", "outcome", "error",
    "http_status", "duration_ms", "late", "answer", "content_type", "consumer_id",
)  # fmt: skip


def log_attempts(lines: list[tuple]) -> None:
    """Append attempt-log lines (tuples in ATTEMPT_COLUMNS order). One COPY of all
    the lines, whatever their number (the driver writes the rows in C; an INSERT … SELECT FROM
    unnest had each array element quoted in Python): the log costs one statement per flush, not
    one model object per attempt. The COPY goes through the connection's execute wrappers, so
    what counts or logs statements sees it."""
    if not lines:
        return
    statement = f"COPY {DeliveryAttempt._meta.db_table} ({', '.join(ATTEMPT_COLUMNS)}) FROM STDIN"

    def copy(sql, rows, many, context):
        with connection.wrap_database_errors, context["cursor"].cursor.copy(sql) as writing:
            for row in rows:
                writing.write_row(row)

    with connection.cursor() as cursor:
        cursor._execute_with_wrappers(statement, lines, many=False, executor=copy)
