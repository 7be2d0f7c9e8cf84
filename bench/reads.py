"""Issue 26, item 6: the reads a person or a machine makes of a large node, timed over the counts
run's small and big tables (bench/counts.py fills the deliveries; this fills the audit trail and
the passports beside them), each with its statements' plans.

- deliveries: `GET outbox/deliveries` filtered by consumer, by a rare event type (1 % of the
  events), by status (dead, pending: 300 rows each) and a second page by its cursor; the
  deliveries admin list, filtered (status, consumer, event type), searched (an event id, a
  passport id, a UPI, a consumer's name), and the dead-letter list;
- the audit trail admin (as many entries as delivered rows): the list, filtered by a rare action
  and a rare actor (1 % each: a full page at 10,000 entries, as at the big size), and the date drill-down (a month, a day);
  searched by a UPI, a consumer's name and part of the rare actor's name (issue 38);
- a consumer's admin page with its health (issue 38: its attempts of 24 hours, last success and
  failure, recent attempts, pending and dead counts) and a passport's with its story;
- `GET dpp` (10,000 and `passports` passports, with their registrations): a page of 50, the next
  page, a page of 200, filtered by status; the statements per page;
- the polls of the admin's live pages (issue 38, item 2: odal.surfaces.live), each a stamp read in one
  query: the dashboard's, the deliveries' and registrations' lists', and a passport's, a
  registration's, a pending delivery's and a consumer's.

Each read is timed as a user meets it (Django's test client through the whole middleware stack,
DEBUG off), median and p95 of 20 calls after 3 warm-ups; then one more call has its SELECTs run
again under EXPLAIN ANALYZE: a sequential scan of a large table in any of them is reported (a
read that reads the table is not flat, however fast it is at the size measured).
"""

import time
import uuid

from bench.counts import CONSUMERS, RARE_TAG, StatementTimer, log, queries_of, timed_calls

# The tables that grow with the node: a plan reading one of these whole is not flat.
LARGE = (
    "outbox_delivery",
    "outbox_event",
    "outbox_deliveryattempt",
    "odal_auditentry",
    "odal_passport",
    "registry_registration",
)
RARE_TYPE = RARE_TAG  # 1 % of the big table's events (counts._insert_chunk)
# The audit trail's actions and actors, by share: a node's trail is mostly bulk intake and the
# registry's answers; a staff member's action is rare.
AUDIT_ACTIONS = "CASE WHEN g %% 100 = 3 THEN 'consumer_paused' WHEN g %% 10 = 2 THEN 'registry_handle_recorded' WHEN g %% 2 = 0 THEN 'passport_published' ELSE 'passport_created' END"  # noqa: E501
AUDIT_ACTORS = (
    "CASE WHEN g %% 100 = 1 THEN 'admin:alice' WHEN g %% 3 = 0 THEN 'system' ELSE 'cli:importer' END"
)
RARE_ACTION, RARE_ACTOR = "consumer_paused", "admin:alice"
HISTORY_DAYS = 60


def chunks(n: int, size: int = 1_000_000):
    """(first, last) of each chunk of generate_series(1, n), `size` rows each (the last fewer)."""
    for first in range(1, n + 1, size):
        yield first, min(n, first + size - 1)


def fill_audit(n: int) -> float:
    """n audit entries made evenly over the past HISTORY_DAYS, oldest first. The trail is
    append-only (a trigger refuses DELETE), so it is emptied by TRUNCATE."""
    from django.db import connection

    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE odal_auditentry")
        for first, last in chunks(n):
            cursor.execute(
                "INSERT INTO odal_auditentry (at, actor, action, object_type, object_id, reason, details) "
                f"SELECT now() - ({n} - g)::float8 / {n} * interval '{HISTORY_DAYS} days', {AUDIT_ACTORS}, "
                f"{AUDIT_ACTIONS}, 'odal.passport', md5('p' || g)::uuid::text, "
                "CASE WHEN g %% 100 = 1 THEN 'consumer answering 500s, paused until fixed' ELSE '' END, "
                "'{}'::jsonb FROM generate_series(%s, %s) g",
                [first, last],
            )
        cursor.execute("VACUUM ANALYZE odal_auditentry")
    return time.monotonic() - started


def fill_passports(n: int) -> float:
    """n passports made over the past HISTORY_DAYS: 90 % published (with a registered
    registration), 5 % drafts, 5 % suspended (registration withdrawn)."""
    from django.db import connection

    started = time.monotonic()
    status = "CASE WHEN g %% 20 = 1 THEN 'draft' WHEN g %% 20 = 2 THEN 'suspended' ELSE 'published' END"
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE registry_registrationattempt, registry_registration, odal_passport CASCADE")
        for first, last in chunks(n):
            cursor.execute(
                "INSERT INTO odal_passport (id, upi, operator_id, facility_id, commodity_code, data, status, "
                "created_at, updated_at, published_at, suspended_at) "
                f"SELECT md5('p' || g)::uuid, 'https://id.example.eu/battery/' || g, 'operator-' || g %% 7, "
                f"'facility-' || g %% 31, '850760', jsonb_build_object('capacityKWh', g %% 90), {status}, at, at, "
                f"CASE WHEN {status} <> 'draft' THEN at END, CASE WHEN {status} = 'suspended' THEN at END "
                f"FROM (SELECT g, now() - ({n} - g)::float8 / {n} * interval '{HISTORY_DAYS} days' AS at "
                "FROM generate_series(%s, %s) g) s",
                [first, last],
            )
        cursor.execute(
            "INSERT INTO registry_registration (id, status, operation, attempts, next_attempt_at, claim_token, "
            "correlation_id, handle, last_error, note, created_at, queued_at, submitted_at, registered_at, "
            "abandoned_at, passport_id, last_unknown_at) "
            "SELECT odal_uuid7(), CASE WHEN status = 'suspended' THEN 'withdrawn' ELSE 'registered' END, "
            "CASE WHEN status = 'suspended' THEN 'withdraw' ELSE 'register' END, 1, published_at, NULL, "
            "'', 'reg-' || id, '', '', published_at, published_at, published_at, published_at, NULL, id, NULL "
            "FROM odal_passport WHERE status <> 'draft'"
        )
        for table in ("odal_passport", "registry_registration"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    return time.monotonic() - started


def samples() -> dict:
    """Values the reads look for, taken from the filled tables: a delivery made 40 days ago (its event, passport id and UPI), a consumer, a day and a month of the trail."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT d.event_id, e.payload->>'dppId', e.payload->>'upi', c.id, c.name FROM outbox_delivery d "
            "JOIN outbox_event e ON e.id = d.event_id JOIN outbox_consumer c ON c.id = d.consumer_id "
            "WHERE d.status = 'delivered' AND d.created_at < now() - interval '40 days' "
            "ORDER BY d.created_at DESC, d.id DESC LIMIT 1"
        )
        event_id, dpp_id, upi, consumer_id, consumer_name = cursor.fetchone()
        cursor.execute("SELECT (now() - interval '20 days') AT TIME ZONE 'UTC'")
        day = cursor.fetchone()[0]
        # A passport published 40 days ago, with its registration and its audit entries (fill_audit's
        # object ids are fill_passports' passport ids).
        cursor.execute(
            "SELECT id FROM odal_passport WHERE status = 'published' AND created_at < now() - interval '40 days' "
            "ORDER BY created_at DESC, id DESC LIMIT 1"
        )
        passport = cursor.fetchone()
    return {"event_id": str(event_id), "dpp_id": dpp_id, "upi": upi, "consumer_id": consumer_id,
            "consumer": consumer_name, "day": day, "passport_id": str(passport[0]) if passport else None}  # fmt: skip


def reads(s: dict) -> dict[str, tuple[str, str, dict]]:
    """{name: (label, path, query)}: the deliveries' and the trail's reads (the passports' are in
    passport_reads)."""
    api = "/vault/api/v1/outbox/deliveries"
    deliveries, dead, trail = (
        "/admin/outbox/delivery/",
        "/admin/outbox/deadletter/",
        "/admin/odal/auditentry/",
    )
    day = s["day"]
    return {
        "api_consumer": ("GET outbox/deliveries?consumer=", api, {"consumer": s["consumer"]}),
        "api_type": ("GET outbox/deliveries?eventType= (a type of 1 % of the events)", api,
                     {"eventType": RARE_TYPE}),
        "api_dead": ("GET outbox/deliveries?status=dead", api, {"status": "dead"}),
        "api_pending": ("GET outbox/deliveries?status=pending", api, {"status": "pending"}),
        "api_next": ("GET outbox/deliveries?consumer=, the next page (its cursor)", api,
                     {"consumer": s["consumer"], "cursor": "(next)"}),
        "admin_list": ("deliveries admin list", deliveries, {}),
        "admin_dead": ("deliveries admin, status filter (dead)", deliveries, {"status__exact": "dead"}),
        "admin_consumer": ("deliveries admin, consumer filter", deliveries,
                           {"consumer__id__exact": str(s["consumer_id"])}),
        "admin_type": ("deliveries admin, event type filter (1 % of the events)", deliveries,
                       {"event_type": RARE_TYPE}),
        "search_event": ("deliveries admin, search: an event id", deliveries, {"q": s["event_id"]}),
        "search_passport": ("deliveries admin, search: a passport id", deliveries, {"q": s["dpp_id"]}),
        "search_upi": ("deliveries admin, search: a UPI", deliveries, {"q": s["upi"]}),
        "search_consumer": ("deliveries admin, search: a consumer's name", deliveries, {"q": s["consumer"]}),
        "dead_letters": ("dead-letter admin list", dead, {}),
        "audit_list": ("audit trail admin list", trail, {}),
        "audit_action": ("audit trail admin, action filter (1 % of entries)", trail, {"action": RARE_ACTION}),
        "audit_actor": ("audit trail admin, actor filter (1 % of entries)", trail, {"actor": RARE_ACTOR}),
        "audit_month": ("audit trail admin, date drill-down: a month", trail,
                        {"at__year": str(day.year), "at__month": str(day.month)}),
        "audit_day": ("audit trail admin, date drill-down: a day", trail,
                      {"at__year": str(day.year), "at__month": str(day.month), "at__day": str(day.day)}),
        # Issue 38, items 3 and 4: a consumer's page with its health (its 24 hours of attempts are
        # a quarter of a day's, as every consumer's), and a passport's page with its story.
        "consumer_health": ("consumer admin page, with its health (outbox.health)",
                            f"/admin/outbox/consumer/{s['consumer_id']}/change/", {}),
        **({"passport_story": ("passport admin page, with its story (odal.surfaces.story)",
                               f"/admin/odal/passport/{s['passport_id']}/change/", {})}
           if s.get("passport_id") else {}),
        "audit_search_upi": ("audit trail admin, search: a UPI", trail, {"q": s["upi"]}),
        "audit_search_consumer": ("audit trail admin, search: a consumer's name", trail, {"q": s["consumer"]}),
        "audit_search_actor": ("audit trail admin, search: part of an actor (1 % of entries)", trail,
                               {"q": RARE_ACTOR.split(":")[1]}),
    }  # fmt: skip


def passport_reads() -> dict[str, tuple[str, str, dict]]:
    api = "/vault/api/v1/dpp"
    return {
        "dpp_page": ("GET dpp, a page of 50", api, {}),
        "dpp_next": ("GET dpp, the next page (its cursor)", api, {"cursor": "(next)"}),
        "dpp_200": ("GET dpp?limit=200", api, {"limit": "200"}),
        "dpp_suspended": ("GET dpp?status=suspended (5 % of passports)", api, {"status": "suspended"}),
    }


def live_samples() -> dict:
    """Objects whose pages poll: the newest passport with its registration, a pending delivery and
    its consumer."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.passport_id, r.id FROM registry_registration r ORDER BY r.created_at DESC LIMIT 1"
        )
        passport, registration = cursor.fetchone()
        cursor.execute("SELECT id, consumer_id FROM outbox_delivery WHERE status = 'pending' LIMIT 1")
        delivery, consumer = cursor.fetchone()
    return {"passport": passport, "registration": registration, "delivery": delivery, "consumer": consumer}


def live_reads(s: dict) -> dict[str, tuple[str, str, dict]]:
    """The polls of the admin's live pages (odal.surfaces.live: /admin/odal/live/<kind>/[<pk>/])."""
    poll = "/admin/odal/live"
    return {
        "live_dashboard": ("live poll: the dashboard's stamp", f"{poll}/dashboard/", {}),
        "live_deliveries": ("live poll: the deliveries lists' stamp", f"{poll}/deliveries/", {}),
        "live_registrations": ("live poll: the registrations lists' stamp", f"{poll}/registrations/", {}),
        "live_passport": ("live poll: a passport's stamp", f"{poll}/passport/{s['passport']}/", {}),
        "live_registration": ("live poll: a registration's stamp", f"{poll}/registration/{s['registration']}/", {}),
        "live_delivery": ("live poll: a pending delivery's stamp", f"{poll}/delivery/{s['delivery']}/", {}),
        "live_consumer": ("live poll: a consumer's stamp", f"{poll}/consumer/{s['consumer']}/", {}),
    }  # fmt: skip


def plan_of(sql: str, params: tuple) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def seq_scans(plan: str) -> list[str]:
    return sorted({t for t in LARGE if f"Seq Scan on {t} " in plan + " "})


def measure(named: dict, *, warmups: int = 3, calls: int = 20) -> dict:
    """{name: {"label", "median", "p95", "statements", "seq_scans", "plan", "slowest"}}."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import override_settings

    from odal.core.models import ApiToken

    user_model = get_user_model()
    admin = user_model.objects.filter(username="bench-admin").first() or user_model.objects.create_superuser(
        "bench-admin", "bench@example.com", uuid.uuid4().hex
    )
    _, token = ApiToken.objects.issue(name=f"bench-reads-{uuid.uuid4().hex[:6]}", scope="read")
    browser = Client(SERVER_NAME="localhost")
    browser.force_login(admin)
    api = Client(SERVER_NAME="localhost", headers={"Authorization": f"Bearer {token}"})
    found = {}
    with override_settings(DEBUG=False):
        assert not settings.DEBUG
        for name, (label, path, query) in named.items():
            client = api if path.startswith("/vault/") else browser
            if query.get("cursor") == "(next)":  # the next page: the first page's cursor
                first = client.get(path, {k: v for k, v in query.items() if k != "cursor"})
                query = {**query, "cursor": first.json()["nextCursor"]}

            def call(client=client, path=path, query=query):
                r = client.get(path, query)
                assert r.status_code == 200, (path, query, r.status_code, r.content[:300])
                return r

            started = time.perf_counter()
            call()
            first_ms = (time.perf_counter() - started) * 1000
            n_warm, n_calls = (warmups, calls) if first_ms < 1000 else (0, 3)  # (a slow read: a few calls)
            times = timed_calls(call, warmups=n_warm, calls=n_calls)
            timer = StatementTimer()
            with connection.execute_wrapper(timer):
                statements = queries_of(call)
            plans = [
                (sql, plan_of(sql, params))
                for sql, params in statements
                if sql.lstrip().upper().startswith(("SELECT", "WITH")) and any(t in sql for t in LARGE)
            ]
            scans = sorted({t for _, plan in plans for t in seq_scans(plan)})
            slowest = max(plans, key=lambda p: actual_ms(p[1]), default=("", ""))
            found[name] = {
                "label": label,
                "median": times["median"],
                "p95": times["p95"],
                "statements": len(statements),
                "seq_scans": scans,
                "plan": slowest[1],
                "sql": slowest[0],
            }
            log(f"{name}: {found[name]['median']:.1f} ms (p95 {found[name]['p95']:.1f}), "
                f"{len(statements)} statements{', SEQ SCAN ' + ' '.join(scans) if scans else ''}")  # fmt: skip
    return found


def actual_ms(plan: str) -> float:
    """The execution time EXPLAIN ANALYZE reports at the end of a plan."""
    for line in reversed(plan.splitlines()):
        if line.strip().startswith("Execution Time:"):
            return float(line.split(":")[1].split()[0])
    return 0.0


def run_at(size: int, passports: int) -> dict:
    """After counts.fill_history(size): fill the trail (size entries) and `passports` passports,
    then time every read."""
    seconds = fill_audit(size)
    log(f"audit trail: {size:,} entries in {seconds:.0f} s")
    seconds = fill_passports(passports)
    log(f"passports: {passports:,} in {seconds:.0f} s")
    return {
        "passports": passports,
        "reads": measure(reads(samples())),
        "passport_reads": measure(passport_reads()),
        "live_reads": measure(live_reads(live_samples())),
    }


def report(c: dict) -> tuple[list, list, str]:
    """Rows, targets and a section of docs/performance.md from counts.run's result (whose sizes
    carry run_at's figures under "reads")."""
    small, big = c["sizes"][0], c["sizes"][-1]
    a, b = c[small]["reads"], c[big]["reads"]
    rows, targets, plans = [], [], []
    groups = [("reads", (small, big)), ("passport_reads", (a["passports"], b["passports"]))]
    groups += [("live_reads", (small, big))] if "live_reads" in a and "live_reads" in b else []
    for group, at in groups:
        for name, x in a[group].items():
            y = b[group][name]
            ratio = y["median"] / x["median"]
            rows.append((f"{x['label']}, median / p95, {at[0]:,} → {at[1]:,}",
                         f"{x['median']:.1f} / {x['p95']:.1f} → {y['median']:.1f} / {y['p95']:.1f} ms "
                         f"({ratio:.2f}×)"))  # fmt: skip
            targets.append((f"{x['label']}: within 2× from {at[0]:,} to {at[1]:,}", ratio <= 2))
            targets.append((f"{x['label']}: under 100 ms at {at[1]:,}", y["median"] < 100))
            targets.append(
                (f"{x['label']}: no sequential scan of a large table at {at[1]:,}", not y["seq_scans"])
            )
            plans.append(f"{x['label']}, at {at[1]:,} (its slowest SELECT):\n\n"
                         + "\n".join("    " + line for line in (y["sql"] + "\n\n" + y["plan"]).splitlines()))  # fmt: skip
    pages = {name: (a["passport_reads"][name]["statements"], b["passport_reads"][name]["statements"])
             for name in a["passport_reads"]}  # fmt: skip
    fixed = len({n for pair in pages.values() for n in pair}) == 1
    rows.append(("GET dpp: statements per page (50, next, 200, filtered) at both sizes",
                 ", ".join(f"{p[0]}/{p[1]}" for p in pages.values())))  # fmt: skip
    targets.append(("GET dpp: the same statements per page, whatever its size and the table's", fixed))
    doc = (
        "## Reads flat to ten million rows (issue 26, item 6)\n\n"
        f"Over the counts' tables ({small:,} and {big:,} deliveries across {CONSUMERS} consumers, 1 % of "
        "the events of a rare type, 300 dead and 300 pending), an audit trail of as many entries (1 % of one "
        "rare action, 1 % of one staff member: the filters' pages are full at both sizes), and "
        f"{a['passports']:,} and {b['passports']:,} passports (90 % published with their registration, 5 % "
        "suspended, 5 % drafts). Each read is timed as a user meets it, DEBUG off (Django's test client "
        "through the whole middleware stack; a read token for the API, a superuser's session for the "
        "admin), median and p95 of 20 calls after 3 warm-ups. Then one more call's SELECTs on the large "
        "tables are run again under EXPLAIN ANALYZE; a sequential scan of a large table fails its target "
        "whatever its time (a read that reads the table grows with it). The plan of each read's slowest "
        f"SELECT at the big size:\n\n" + "\n\n".join(plans) + "\n"
    )
    return rows, targets, doc
