"""Every guard of every terminal write, and the test that must fail without it.

`make mutations` removes each guard in turn (a text replacement in the source), runs the tests
named for it, restores the file, and fails if any removal leaves those tests green. Its output
names each guard and what caught it. Add a line here with every new guard.
"""

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Guard:
    name: str
    path: str
    original: str
    mutant: str
    tests: str  # pytest node ids or -k expression, space separated


GUARDS = [
    Guard(
        "terminal writes (mark_delivered, mark_delivered_each, mark_attempt_failed): status must be pending",
        "outbox/models.py",
        "        return self.filter(status=Delivery.Status.PENDING, claim_token=token)\n",
        "        return self.filter(claim_token=token)\n",
        "tests/test_outbox_claims.py::test_terminal_writes_need_the_expected_status_even_with_the_token",
    ),
    Guard(
        "terminal writes (mark_delivered, mark_delivered_each, mark_attempt_failed): only the current claim token",
        "outbox/models.py",
        "        return self.filter(status=Delivery.Status.PENDING, claim_token=token)\n",
        "        return self.filter(status=Delivery.Status.PENDING)\n",
        "tests/test_outbox_claims.py::test_a_superseded_claim_cannot_end_the_current_attempt",
    ),
    Guard(
        "mark_attempt_failed: dead-letters at max_attempts",
        "outbox/models.py",
        'spent = When(attempts__gte=F("max_attempts"), then=Value(Delivery.Status.DEAD))',
        'spent = When(attempts__gte=F("max_attempts") + 1000, then=Value(Delivery.Status.DEAD))',
        "tests/test_outbox_claims.py::test_the_last_attempt_failing_dead_letters",
    ),
    Guard(
        "mark_attempt_failed: backs off to retry_at",
        "outbox/models.py",
        "                next_attempt_at=retry_at,\n",
        "",
        "tests/test_outbox_claims.py::test_a_failure_by_the_current_claim_backs_off_and_counts_once",
    ),
    Guard(
        "claim: counts the attempt relatively, at claim time",
        "outbox/claims.py",
        'attempts=F("attempts") + 1',
        "attempts=1",
        "tests/test_outbox_claims.py::test_overlapping_attempts_count_twice_so_the_bound_holds",
    ),
    Guard(
        "claim: pushes next_attempt_at past now by the hold",
        "outbox/claims.py",
        "        held_until = now + hold\n",
        "        held_until = now\n",
        "tests/test_outbox_claims.py::test_a_claimed_row_is_not_due_until_its_hold_expires",
    ),
    Guard(
        "claim: FOR UPDATE SKIP LOCKED",
        "outbox/claims.py",
        ".select_for_update(skip_locked=True)",
        ".select_for_update()",
        "tests/test_outbox_claims.py::test_a_claim_skips_rows_another_claimer_has_locked",
    ),
    Guard(
        "claim: never more rows than its limit, however many claim at once",
        "outbox/claims.py",
        """                .values_list("pk", flat=True)[:limit]\n""",
        """                .values_list("pk", flat=True)\n""",
        "tests/test_outbox_claims.py -k limit",
    ),
    Guard(
        "claim: never claims a delivery whose attempts are spent",
        "outbox/models.py",
        'return self.due(now).filter(attempts__lt=F("max_attempts"))',
        "return self.due(now)",
        "tests/test_outbox_claims.py::test_overlapping_attempts_count_twice_so_the_bound_holds",
    ),
    Guard(
        "dead_letter_exhausted: only spent rows",
        "outbox/models.py",
        '            .filter(attempts__gte=F("max_attempts"))\n            .update(\n',
        "            .update(\n",
        "tests/test_outbox_claims.py::test_dead_lettering_leaves_rows_with_attempts_left",
    ),
    Guard(
        "dead_letter_exhausted: only due rows (not one whose last attempt is in flight)",
        "outbox/models.py",
        "            self.due(now)\n            .filter(attempts__gte",
        "            self.filter(status__in=self.claimable_statuses)\n            .filter(attempts__gte",
        "tests/test_outbox_claims.py::test_a_spent_row_in_flight_is_not_dead_lettered_before_its_hold_expires",
    ),
    Guard(
        "replay: only dead rows",
        "outbox/models.py",
        "                self.filter(status=Delivery.Status.DEAD)\n                .select_for_update()",
        "                self.all()\n                .select_for_update()",
        "tests/test_outbox_api.py::test_replay_of_a_live_or_delivered_row_is_409",
    ),
    Guard(
        "replay: a reason is required and checked",
        "outbox/models.py",
        "        reason = clean_reason(reason)\n",
        "",
        "tests/test_outbox_api.py -k test_replay_refuses_a_bad_reason",
    ),
    Guard(
        "sweep: a write that took nothing is logged as late",
        "outbox/sweep.py",
        "_attempt_line(token, f, late=f.delivery.pk not in taken)",
        "_attempt_line(token, f, late=False)",
        "tests/test_outbox_sweep.py::test_a_slow_sweep_cannot_undo_what_a_faster_one_settled",
    ),
    Guard(
        "sweep: at most ODAL_WEBHOOK_CONCURRENCY requests in flight per consumer",
        "outbox/sweep.py",
        "            while queue and running[consumer_id] < bound:\n",
        "            while queue:\n",
        "tests/test_outbox_sweep.py -k concurrently",
    ),
    Guard(
        "sweep: no attempt (webhook or Python) starts after the claim's hold ran out",
        "outbox/sweep.py",
        "    if not claim.holds():\n        return None\n",
        "",
        "tests/test_outbox_sweep.py -k hold_ran_out",
    ),
    Guard(
        "wake: a commit NOTIFYs the listening sweep",
        "outbox/wake.py",
        """                "SELECT pg_notify(%s, ''), pg_try_advisory_xact_lock_shared(%s)", [CHANNEL, LISTENER_LOCK]""",
        """                "SELECT length(%s), pg_try_advisory_xact_lock_shared(%s)", [CHANNEL, LISTENER_LOCK]""",
        "tests/test_outbox_wake.py::test_a_commit_wakes_the_listening_sweep_and_enqueues_no_task",
    ),
    Guard(
        "wake: no django-q2 task is enqueued while a sweep listens",
        "outbox/kick.py",
        "    if not notify_sweep():\n",
        "    if notify_sweep() or True:\n",
        "tests/test_outbox_wake.py -k enqueues",
    ),
    Guard(
        "wake: an idle listener looks again after poll_seconds (a retry falls due without a NOTIFY)",
        "outbox/sweep.py",
        "                pause = poll_seconds if remaining is None else min(poll_seconds, remaining)\n",
        "                pause = poll_seconds if remaining is None else remaining\n",
        "tests/test_outbox_wake.py::test_a_retry_falling_due_is_swept_by_the_poll_without_a_notification",
    ),
    Guard(
        "wake: one sweep leads at a time",
        "outbox/wake.py",
        """        self.leading = self.conn.execute("SELECT pg_try_advisory_lock(%s)", [LISTENER_LOCK]).fetchone()[0]""",
        """        self.leading = self.conn.execute("SELECT pg_try_advisory_lock(%s) OR true", [LISTENER_LOCK]).fetchone()[0]""",
        "tests/test_outbox_wake.py -k lead",
    ),
    Guard(
        "wake: a leading turn relays while deliveries are pending",
        "outbox/tasks.py",
        """(report.claimed or Delivery.objects.filter(status="pending").exists())""",
        """(report.claimed)""",
        "tests/test_outbox_wake.py -k relay",
    ),
    Guard(
        "audit trail: the database refuses UPDATE and DELETE",
        "odal/migrations/0002_audit_append_only.py",
        "    BEFORE UPDATE OR DELETE ON odal_auditentry",
        "    BEFORE INSERT ON odal_auditentry WHEN (false)",
        "tests/test_audit.py",
    ),
    Guard(
        "tokens: revoked tokens do not authenticate",
        "odal/models.py",
        "self.filter(prefix=parts[1], revoked_at__isnull=True)",
        "self.filter(prefix=parts[1])",
        "tests/test_auth.py::test_revoked_token_is_401",
    ),
    Guard(
        "tokens: the whole secret is compared",
        "odal/models.py",
        "if token is None or not hmac.compare_digest(token.secret_hash, _hash_token(plaintext)):",
        "if token is None:",
        "tests/test_auth.py::test_token_secret_is_not_stored",
    ),
    Guard(
        "API: the scope check",
        "odal/auth.py",
        "if SCOPE_ORDER[principal.scope] < SCOPE_ORDER[self.scope]:",
        "if False:",
        "tests/test_auth.py::test_read_token_cannot_write",
    ),
    Guard(
        "registry drain writes: the expected status",
        "registry/models.py",
        "        rows = self.filter(claim_token=token, status__in=statuses)",
        "        rows = self.filter(claim_token=token)",
        "tests/test_registry_drain.py -k test_every_drain_write_bounces_off_an_abandoned_row",
    ),
    Guard(
        "registry drain writes: only the current claim token",
        "registry/models.py",
        "        rows = self.filter(claim_token=token, status__in=statuses)",
        "        rows = self.filter(status__in=statuses)",
        "tests/test_registry_drain.py -k test_no_drain_write_takes_a_row_held_by_another_claim",
    ),
    Guard(
        "registry mark_rejected: the expected status",
        "registry/models.py",
        "            self.filter(claim_token=token)\n            .filter(\n",
        "            self.filter(claim_token=token)\n            .exclude(\n",
        "tests/test_registry_drain.py -k test_every_drain_write_bounces_off_an_abandoned_row",
    ),
    Guard(
        "abandon: only a pending row",
        "registry/models.py",
        "                status=Registration.Status.PENDING,\n                operation=Registration.Operation.REGISTER,\n                attempts__gte=1,",
        "                operation=Registration.Operation.REGISTER,\n                attempts__gte=1,",
        "tests/test_registry_drain.py -k test_abandon_takes_a_row_only_while_pending_tried_and_backed_off",
    ),
    Guard(
        "abandon: only a register (not a deactivation)",
        "registry/models.py",
        "                operation=Registration.Operation.REGISTER,\n                attempts__gte=1,",
        "                attempts__gte=1,",
        "tests/test_registry_drain.py -k test_abandon_takes_a_row_only_while_pending_tried_and_backed_off",
    ),
    Guard(
        "abandon: attempted at least once",
        "registry/models.py",
        "                attempts__gte=1,\n",
        "",
        "tests/test_registry_drain.py -k test_abandon_takes_a_row_only_while_pending_tried_and_backed_off",
    ),
    Guard(
        "abandon: backed off (next_attempt_at > now)",
        "registry/models.py",
        "                next_attempt_at__gt=now,\n",
        "",
        "tests/test_registry_drain.py -k test_abandon_takes_a_row_only_while_pending_tried_and_backed_off",
    ),
    Guard(
        "abandon: no live claim",
        "registry/models.py",
        "                next_attempt_at__gt=now,\n                claim_token__isnull=True,\n",
        "                next_attempt_at__gt=now,\n",
        "tests/test_registry_drain.py -k test_abandon_takes_a_row_only_while_pending_tried_and_backed_off",
    ),
    Guard(
        "abandon: audit and event only when the update took the row",
        "registry/service.py",
        "        if not Registration.objects.filter(pk=reg.pk).abandon(actor=actor, reason=reason, now=now, seen=reg):",
        "        if not Registration.objects.filter(pk=reg.pk).abandon(actor=actor, reason=reason, now=now, seen=reg) and False:",
        "tests/test_registry_drain.py::test_abandon_writes_nothing_when_the_row_changed_while_the_registry_was_asked",
    ),
    Guard(
        "abandon: 404/409 decided before the registry is asked",
        "registry/service.py",
        "    check_abandonable(reg)\n    reason = clean_reason(reason)\n    ask_registry(reg, adapter)\n",
        "    ask_registry(reg, adapter)\n    check_abandonable(reg)\n    reason = clean_reason(reason)\n",
        "tests/test_registry_api.py -k test_states_abandon_does_not_end_are_409_without_asking",
    ),
    Guard(
        "find_submission: the exhaustive-read rule (an unread task is not proof of absence)",
        "registry/adapters.py",
        "        if unread:\n",
        "        if False:\n",
        "tests/test_registry_api.py -k test_absence_not_proven_is_422",
    ),
    Guard(
        "find_submission: every page is read",
        "registry/adapters.py",
        "            if not cursor:\n                break",
        "            if True:\n                break",
        "tests/test_registry_adapter.py::test_every_page_is_read_before_saying_not_found",
    ),
    Guard(
        "find_submission: rejected requests do not count as held",
        "registry/adapters.py",
        ' and item.get("status") != "rejected"',
        "",
        "tests/test_registry_api.py::test_a_rejected_request_does_not_count_as_held",
    ),
    Guard(
        "record_handle: only a submitted row",
        "registry/models.py",
        "                status=Registration.Status.SUBMITTED,\n                correlation_id=seen.correlation_id,\n",
        "                correlation_id=seen.correlation_id,\n",
        "tests/test_registry_drain.py -k test_record_handle_takes_only_a_submitted_row",
    ),
    Guard(
        "stalled: abandoned rows are never stalled",
        "registry/models.py",
        "        return self.filter(status=Registration.Status.PENDING).filter(\n            Q(attempts__gte",
        "        return self.filter(\n            Q(attempts__gte",
        "tests/test_registry_drain.py::test_abandoned_is_counted_and_not_stalled",
    ),
    Guard(
        "re-publish: an abandoned row is queued afresh",
        "registry/models.py",
        "                Registration.Status.ABANDONED,\n                Registration.Status.SUSPENDED,",
        "                Registration.Status.SUSPENDED,",
        "tests/test_registry_drain.py::test_republish_queues_an_abandoned_registration_afresh",
    ),
    Guard(
        "abandon: the row must still have the attempts read before the registry was asked",
        "registry/models.py",
        "                attempts=seen.attempts,\n                next_attempt_at=seen.next_attempt_at,\n",
        "                next_attempt_at=seen.next_attempt_at,\n",
        "tests/test_registry_drain.py -k test_abandon_takes_nothing_when_the_row_is_no_longer_the_one_seen",
    ),
    Guard(
        "abandon: the row must still have the next_attempt_at read before the registry was asked",
        "registry/models.py",
        "                attempts=seen.attempts,\n                next_attempt_at=seen.next_attempt_at,\n",
        "                attempts=seen.attempts,\n",
        "tests/test_registry_drain.py -k test_abandon_takes_nothing_when_the_row_is_no_longer_the_one_seen",
    ),
    Guard(
        "abandon: a drain attempt during a slow newest-first lookup voids the registry's answer",
        "registry/models.py",
        "                attempts=seen.attempts,\n                next_attempt_at=seen.next_attempt_at,\n",
        "",
        "tests/test_abandon_race.py",
    ),
    Guard(
        "record handle: the row must still be the submission its caller saw",
        "registry/models.py",
        "                correlation_id=seen.correlation_id,\n                attempts=seen.attempts,\n",
        "",
        "tests/test_registry_drain.py -k test_record_handle_takes_nothing_when_the_row_is_no_longer_the_one_seen",
    ),
    Guard(
        "sweep: no Python consumer starts after the claim's hold ran out",
        "outbox/sweep.py",
        "    if not claim.holds():\n        return None\n",
        "",
        "tests/test_sweep_python.py::test_no_python_consumer_starts_after_the_claims_hold_ran_out",
    ),
    Guard(
        "sweep: rows a pass claimed but never started get their counted attempt back",
        "outbox/sweep.py",
        "            Delivery.objects.filter(pk__in=not_started).release(token=self.claim.token)\n",
        "",
        "tests/test_sweep_python.py::test_no_python_consumer_starts_after_the_claims_hold_ran_out",
    ),
    Guard(
        "sweep: webhook outcomes are written while Python consumers run",
        "outbox/sweep.py",
        "                self.python.submit(run_python_consumers, python_jobs, self.client, self.claim)\n",
        "                run_python_consumers(python_jobs, self.client, self.claim)\n",
        "tests/test_sweep_python.py::test_webhook_outcomes_are_written_while_a_python_consumer_runs",
    ),
    Guard(
        "drain: no attempt starts after the claim's hold ran out",
        "registry/drain.py",
        "            if not claim.holds():\n",
        "            if False:\n",
        "tests/test_registry_drain.py::test_a_drain_pass_starts_no_register_after_its_claims_hold_ran_out",
    ),
    Guard(
        "release: only rows still held by the claim's token",
        "outbox/claims.py",
        "        return self.filter(claim_token=token, status__in=self.claimable_statuses).update(\n",
        "        return self.filter(status__in=self.claimable_statuses).update(\n",
        "tests/test_registry_drain.py::test_release_gives_back_only_rows_the_claim_still_holds",
    ),
    Guard(
        "release: only rows still in a claimable status",
        "outbox/claims.py",
        "        return self.filter(claim_token=token, status__in=self.claimable_statuses).update(\n",
        "        return self.filter(claim_token=token).update(\n",
        "tests/test_registry_drain.py::test_release_gives_back_only_rows_the_claim_still_holds",
    ),
    Guard(
        "record handle: a suspended passport's registration owes a deactivation",
        "registry/service.py",
        "        deactivate_if_suspended(reg)\n",
        "",
        "tests/test_lifecycle_races.py::test_recording_a_handle_for_a_suspended_passport_queues_its_deactivation",
    ),
    Guard(
        "re-publish: only a never-attempted deactivation is cancelled",
        "registry/models.py",
        "            attempts=0 if token is None else 1,\n",
        "",
        "tests/test_lifecycle_races.py::test_republish_after_an_attempted_deactivation_registers_afresh",
    ),
    Guard(
        "drain: a deactivation re-reads its passport and sends nothing if it is published again",
        "registry/drain.py",
        "    if service.passport_status_locked(reg.passport_id) == Passport.Status.PUBLISHED:\n",
        "    if False:\n",
        "tests/test_lifecycle_races.py -k test_a_deactivation_whose_passport_was_published_again_sends_nothing",
    ),
    Guard(
        "drain: deactivated while published again registers afresh",
        "registry/drain.py",
        "        service.reregister_if_published(reg)\n",
        "",
        "tests/test_lifecycle_races.py::test_published_again_while_the_registry_deactivated_registers_afresh",
    ),
    Guard(
        "drain: the registered path waits for the passport's row lock (a committing suspend is seen)",
        "registry/service.py",
        "return Passport.objects.select_for_update().filter(pk=dpp_id).values_list(",
        "return Passport.objects.filter(pk=dpp_id).values_list(",
        "tests/test_lifecycle_races.py::test_a_suspend_committing_while_the_drain_records_registered_is_never_missed",
    ),
    Guard(
        "publish and suspend: each takes the passport's row lock first",
        "odal/lifecycle.py",
        "    if not Passport.objects.select_for_update().filter(pk=dpp_id).exists():\n",
        "    if not Passport.objects.filter(pk=dpp_id).exists():\n",
        "tests/test_passport_races.py",
    ),
    Guard(
        "admin: replay needs outbox.replay_delivery",
        "outbox/admin.py",
        '        return request.user.has_perm("outbox.replay_delivery")\n',
        "        return True\n",
        "tests/test_permissions_table.py -k replay_selected",
    ),
    Guard(
        "admin: abandon needs registry.abandon_registration",
        "registry/admin.py",
        '        return request.user.has_perm("registry.abandon_registration")\n',
        "        return True\n",
        "tests/test_permissions_table.py -k abandon_selected",
    ),
    Guard(
        "admin: record handle needs registry.record_handle",
        "registry/admin.py",
        '        return request.user.has_perm("registry.record_handle")\n',
        "        return True\n",
        "tests/test_permissions_table.py -k record_handle_selected",
    ),
    Guard(
        "admin: publish needs odal.publish_passport",
        "odal/admin.py",
        '        return request.user.has_perm("odal.publish_passport")\n',
        "        return True\n",
        "tests/test_permissions_table.py -k publish_selected",
    ),
    Guard(
        "admin: suspend needs odal.suspend_passport",
        "odal/admin.py",
        '        return request.user.has_perm("odal.suspend_passport")\n',
        "        return True\n",
        "tests/test_permissions_table.py -k suspend_selected",
    ),
    Guard(
        "admin: revoking tokens needs odal.add_apitoken",
        "odal/admin.py",
        '        return request.user.has_perm("odal.add_apitoken")\n',
        "        return True\n",
        "tests/test_auth.py::test_revoking_in_the_admin_needs_the_token_permission",
    ),
    Guard(
        "API: a staff session needs the route's permission",
        "odal/auth.py",
        "        if not user.has_perm(self.perm):\n",
        "        if False:\n",
        "tests/test_auth.py::test_a_session_needs_the_routes_permission",
    ),
    Guard(
        "API: a session write needs the CSRF token",
        "odal/auth.py",
        "            if request.method not in SAFE_METHODS and check_csrf(request) is not None:\n",
        "            if False:\n",
        "tests/test_auth.py::test_session_write_needs_csrf_token",
    ),
    Guard(
        "admin: only a superuser mints an admin token",
        "odal/admin.py",
        '        if db_field.name == "scope" and not request.user.is_superuser:\n',
        "        if False:\n",
        "tests/test_auth.py::test_staff_who_may_add_tokens_cannot_mint_an_admin_token",
    ),
    Guard(
        "tokens: revoke takes (and audits) only live tokens",
        "odal/models.py",
        "if self.model.objects.filter(pk=pk, revoked_at__isnull=True).update(revoked_at=at) != 1:",
        "if self.model.objects.filter(pk=pk).update(revoked_at=at) != 1:",
        "tests/test_auth.py::test_revoking_audits_each_token_it_took_and_only_those",
    ),
    Guard(
        "tokens: revocation is audited",
        "odal/models.py",
        '                    action="token_revoked",\n',
        '                    action="token_revoked_not",\n',
        "tests/test_auth.py::test_the_admin_action_audits_a_revocation tests/test_auth.py::test_the_command_audits_a_revocation",
    ),
    Guard(
        "metrics: the token is required when configured",
        "odal/views.py",
        "    if not metrics_token_given(request):\n",
        "    if False:\n",
        "tests/test_security.py -k test_metrics_refuse_a_missing_or_wrong_token",
    ),
    Guard(
        "metrics: the token is compared",
        "odal/views.py",
        '    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())\n',
        '    return scheme.lower() == "bearer"\n',
        "tests/test_security.py -k test_metrics_refuse_a_missing_or_wrong_token",
    ),
    Guard(
        "settings: production needs ODAL_METRICS_TOKEN",
        "odal/settings.py",
        "if PRODUCTION and not ODAL_METRICS_TOKEN:\n",
        "if False:\n",
        "tests/test_settings.py::test_production_refuses_to_start_without_a_metrics_token",
    ),
    Guard(
        "passport admin: lifecycle fields are read-only",
        "odal/admin.py",
        '        "id",\n        *LIFECYCLE_FIELDS,\n',
        '        "id",\n',
        "tests/test_security.py::test_the_passport_admin_cannot_write_lifecycle_fields",
    ),
    Guard(
        "passport admin: an edit writes only the fields it changed",
        "odal/admin.py",
        '            values = {name: getattr(obj, name) for name in [*fields, "updated_at"]}\n',
        "            values = {f.attname: getattr(obj, f.attname) for f in Passport._meta.concrete_fields if not f.primary_key}\n",
        "tests/test_security.py::test_an_admin_edit_does_not_undo_a_publish_committed_meanwhile",
    ),
    Guard(
        "passport admin: edits are audited",
        "odal/admin.py",
        '                actor=actor_of(request), action="passport_changed", obj=obj, details={"fields": fields}\n',
        '                actor=actor_of(request), action="passport_changed_not", obj=obj, details={"fields": fields}\n',
        "tests/test_security.py::test_passport_edits_in_the_admin_are_audited",
    ),
    Guard(
        "passport admin: deletions are audited",
        "odal/admin.py",
        '            action="passport_deleted",\n',
        '            action="passport_deleted_not",\n',
        "tests/test_security.py::test_passport_deletions_in_the_admin_are_audited",
    ),
    Guard(
        "passport admin: a registration found at delete time is a message",
        "odal/admin.py",
        "        except ProtectedError:\n            self.refuse_protected(request)\n            return HttpResponseRedirect(",
        "        except ZeroDivisionError:\n            self.refuse_protected(request)\n            return HttpResponseRedirect(",
        "tests/test_security.py::test_a_registration_appearing_after_the_delete_check_is_a_message_not_a_500",
    ),
    Guard(
        "webhooks: the connection goes to the address that was checked (pinned), not to a second lookup",
        "outbox/consumers.py",
        "str(pin.address),",
        "host,",
        "tests/test_webhook_pinning.py::test_a_name_that_rebinds_after_the_check_is_connected_to_at_the_checked_address",
    ),
    Guard(
        "webhooks: an https connection verified for one name carries no other name's request (pooled by name)",
        "outbox/consumers.py",
        "        with pinned(target), client.stream(\n"
        '            "POST", consumer.url, content=body.encode(), headers=headers,\n'
        "            timeout=consumer.timeout_seconds, follow_redirects=False,\n",
        "        with pinned(Target(str(target.address), target.address)), client.stream(\n"
        '            "POST", httpx.URL(consumer.url).copy_with(host=str(target.address)), content=body.encode(),\n'
        '            headers={**headers, "host": httpx.URL(consumer.url).netloc.decode()},\n'
        '            timeout=consumer.timeout_seconds, follow_redirects=False, extensions={"sni_hostname": target.name},\n',
        "tests/test_webhook_pinning.py::test_a_tls_connection_verified_for_one_name_does_not_carry_another_names_request",
    ),
    Guard(
        "webhooks: TLS names and verifies the host, not the pinned address",
        "outbox/consumers.py",
        '        with pinned(target), client.stream(\n            "POST", consumer.url,',
        "        with pinned(Target(str(target.address), target.address)), client.stream(\n"
        '            "POST", httpx.URL(consumer.url).copy_with(host=str(target.address)),',
        "tests/test_webhook_pinning.py::test_https_connects_to_the_address_and_verifies_the_name",
    ),
    Guard(
        "webhooks: certificates are verified",
        "outbox/consumers.py",
        "ssl_context = httpx.create_ssl_context(verify=verify)",
        "ssl_context = httpx.create_ssl_context(verify=False)",
        "tests/test_webhook_pinning.py::test_a_tls_connection_verified_for_one_name_does_not_carry_another_names_request "
        "tests/test_webhook_pinning.py::test_in_production_the_request_goes_to_the_checked_address_in_the_name_of_the_host",
    ),
    Guard(
        "webhook client: no pin for the host, no connection (never a lookup of its own)",
        "outbox/consumers.py",
        'raise httpcore.ConnectError(f"no checked address for {host}: not connected")',
        "return self.network.connect_tcp(host, port, timeout=timeout)",
        "tests/test_webhook_pinning.py::test_the_webhook_client_connects_nowhere_without_a_pin_for_the_host",
    ),
    Guard(
        "webhook client: a pin serves its own host name only",
        "outbox/consumers.py",
        "if pin is None or pin.name != host:",
        "if pin is None:",
        "tests/test_webhook_pinning.py::test_the_webhook_client_connects_nowhere_without_a_pin_for_the_host",
    ),
    Guard(
        "webhook client: its httpx transport sends through the pinning pool",
        "outbox/consumers.py",
        "self._pool = httpcore.ConnectionPool(",
        "self._unused = httpcore.ConnectionPool(",
        "tests/test_webhook_pinning.py::test_a_name_that_rebinds_after_the_check_is_connected_to_at_the_checked_address",
    ),
    Guard(
        "call_webhook: sends with no client but webhook_client()'s",
        "outbox/consumers.py",
        "if not isinstance(client, _WebhookClient):",
        "if False:",
        "tests/test_webhook_pinning.py::test_call_webhook_sends_with_no_client_but_the_pinned_one",
    ),
    Guard(
        "webhooks: connections are kept alive and reused, https too",
        "outbox/consumers.py",
        '"accept-encoding": "identity"}',
        '"accept-encoding": "identity", "connection": "close"}',
        "tests/test_webhook_pinning.py::test_https_connections_are_kept_alive_and_reused "
        "tests/test_webhook_pinning.py::test_plain_http_connections_are_kept_alive_and_reused_per_name",
    ),
    Guard(
        "webhooks: in production every address is checked, before every request (a pooled connection or not)",
        "outbox/consumers.py",
        "    if not settings.ODAL_ALLOW_PRIVATE_WEBHOOKS:\n        for address in addresses:\n",
        "    if False:\n        for address in addresses:\n",
        "tests/test_webhook_pinning.py::test_a_name_that_resolves_inside_in_production_is_not_connected_to "
        "tests/test_webhook_pinning.py::test_in_production_a_kept_alive_connection_is_not_used_once_its_name_resolves_inside",
    ),
    Guard(
        "find_submission: UPIs compared by their canonical form",
        "registry/adapters.py",
        'elif upi_key(item["upi"]) == wanted and',
        'elif item["upi"] == upi and',
        "tests/test_registry_answers.py -k test_abandon_is_refused_when_the_registry_lists_the_submission_under_another_spelling",
    ),
    Guard(
        "find_submission: a repeated cursor ends the read",
        "registry/adapters.py",
        "            if cursor in cursors:\n",
        "            if False:\n",
        "tests/test_registry_answers.py::test_a_task_list_repeating_its_cursor_is_unreadable",
    ),
    Guard(
        "find_submission: the whole lookup runs under one deadline",
        "registry/adapters.py",
        "        deadline = time.monotonic() + seconds\n",
        "        deadline = time.monotonic() + 3600\n",
        "tests/test_registry_answers.py::test_the_lookup_ends_at_its_deadline_however_many_pages_are_left",
    ),
    Guard(
        "_send: a lookup's request gets only what is left of its deadline",
        "registry/adapters.py",
        "max(0.001, min(self.timeout, deadline - now))",
        "self.timeout",
        "tests/test_registry_answers.py::test_one_slow_page_is_cut_short_at_the_lookups_deadline",
    ),
    Guard(
        "find_submission: the page limit is never absence",
        "registry/adapters.py",
        '            raise RegistryUnreadable(\n                f"the task list has more than {MAX_TASK_PAGES} pages; it was not read to its end"\n            )\n',
        "            return NotFound(exhaustive=True)\n",
        "tests/test_registry_answers.py::test_more_pages_than_the_limit_is_unreadable_not_absence",
    ),
    Guard(
        "registry ids: an id over MAX_ID is a protocol error, not a write",
        "registry/adapters.py",
        "    if isinstance(value, str) and len(value) > MAX_ID:\n",
        "    if False:\n",
        "tests/test_registry_answers.py::test_a_request_id_over_500_characters_is_a_protocol_error_and_the_row_stays_fixable",
    ),
    Guard(
        "registry ids: 500 characters kept",
        "registry/adapters.py",
        "MAX_ID = 500  #",
        "MAX_ID = 200  #",
        "tests/test_registry_answers.py::test_ids_of_300_characters_are_kept_and_the_registration_goes_through",
    ),
    Guard(
        "record handle: as long as the registry's ids",
        "registry/service.py",
        "MAX_HANDLE_LENGTH = adapters.MAX_ID",
        "MAX_HANDLE_LENGTH = 200",
        "tests/test_registry_answers.py::test_a_registration_id_over_500_characters_is_a_protocol_error_and_a_handle_can_be_recorded",
    ),
    Guard(
        "metrics: protocol errors counted",
        "odal/migrations/0005_tally_and_heartbeats.py",
        "operation FROM new_rows\n            WHERE outcome = 'failed' AND left(",
        "operation FROM new_rows\n            WHERE outcome = 'failed' OR left(",
        "tests/test_registry_answers.py::test_a_request_id_over_500_characters_is_a_protocol_error_and_the_row_stays_fixable tests/test_tally.py::test_registry_attempt_lines_count_late_answers_protocol_errors_and_write_errors",
    ),
    Guard(
        "canonical_upi: no default port",
        "odal/upi.py",
        'f":{port}" if port is not None and port != DEFAULT_PORT else ""',
        'f":{port}" if port is not None else ""',
        "tests/test_upi.py::test_the_four_spellings_make_one_passport_through_the_api",
    ),
    Guard(
        "API and command line: the canonical form is stored",
        "odal/rules.py",
        "    return canonical_upi(value)\n",
        "    return canonical_upi(value) and value.strip()\n",
        "tests/test_upi.py::test_the_four_spellings_make_one_passport_through_the_api tests/test_upi.py::test_the_command_line_stores_the_canonical_form",
    ),
    Guard(
        "admin passport form: the canonical form is stored",
        "odal/upi.py",
        '            return canonical_upi(self.cleaned_data.get("upi"))\n',
        '            return canonical_upi(self.cleaned_data.get("upi")) and self.cleaned_data.get("upi")\n',
        "tests/test_upi.py::test_the_admin_stores_the_canonical_form_and_refuses_what_the_api_refuses",
    ),
    Guard(
        "canonicalise_upis: colliding UPIs are reported, not merged",
        "odal/upi.py",
        "        if canonical in holders or len(rows) > 1:\n",
        "        if False:\n",
        "tests/test_upi.py::test_the_migration_canonicalises_stored_upis_and_reports_collisions_unmerged",
    ),
    Guard(
        "input rules: an event type is matched whole (no final newline)",
        "odal/rules.py",
        "not EVENT_TYPE.fullmatch(value)",
        'not re.match(EVENT_TYPE.pattern + "$", value)',
        "tests/test_input_rules.py::test_a_newline_is_never_part_of_an_event_type tests/test_input_rules.py::test_an_event_type_ending_in_a_newline_is_not_an_event_type",
    ),
    Guard(
        "input rules: an attempt budget is at least 1",
        "odal/rules.py",
        "ATTEMPTS = (1, 1000)",
        "ATTEMPTS = (0, 1000)",
        "tests/test_input_rules.py -k attempt_budget",
    ),
    Guard(
        "input rules: a timeout is at most 60 s",
        "odal/rules.py",
        "TIMEOUT_SECONDS = (1, 60)",
        "TIMEOUT_SECONDS = (1, 2_147_483_647)",
        "tests/test_input_rules.py -k timeout",
    ),
    Guard(
        "input rules: text no longer than its column",
        "odal/rules.py",
        "    if len(value) > max_length:\n",
        "    if False:\n",
        "tests/test_input_rules.py -k facility_id or commodity_code or token_name or actor",
    ),
    Guard(
        "input rules: no control characters in a line of text",
        "odal/rules.py",
        "    if has_control_character(value):\n        raise ValueError(CONTROL_PROBLEM)\n",
        "    if False:\n        raise ValueError(CONTROL_PROBLEM)\n",
        "tests/test_input_rules.py -k operator_id or facility_id or commodity_code",
    ),
    Guard(
        "input rules: consumer names are ASCII letters, digits, - and _",
        "odal/rules.py",
        'NAME = re.compile(r"[A-Za-z0-9_-]+")',
        'NAME = re.compile(r"[\\w -]+")',
        "tests/test_input_rules.py -k consumer_name",
    ),
    Guard(
        "input rules: a time that overflows in UTC is refused",
        "odal/rules.py",
        "        return value.astimezone(UTC)\n",
        "        return value\n",
        "tests/test_input_rules.py::test_a_cursor_whose_time_overflows_in_utc_is_refused",
    ),
    Guard(
        "input rules: batch sizes from 1",
        "odal/rules.py",
        "BATCH = (1, 10_000)",
        "BATCH = (-10_000, 10_000)",
        "tests/test_input_rules.py -k batch_size",
    ),
    Guard(
        "input rules: ports up to 65535",
        "odal/rules.py",
        "PORT = (1, 65_535)",
        "PORT = (1, 999_999)",
        "tests/test_input_rules.py -k port",
    ),
    Guard(
        "API: a consumer's name through its rule",
        "outbox/api.py",
        "        return rules.consumer_name(value)\n",
        "        return value\n",
        "tests/test_input_rules.py -k consumer_name",
    ),
    Guard(
        "API: deadSince through the time rule",
        "outbox/api.py",
        "        return None if value is None else rules.moment(value)\n",
        "        return value\n",
        "tests/test_input_rules.py -k time",
    ),
    Guard(
        "admin consumer form: the attempt budget through its rule",
        "outbox/admin.py",
        '        return rules.form_value(rules.attempt_budget, self.cleaned_data.get("max_attempts"))\n',
        '        return self.cleaned_data.get("max_attempts")\n',
        "tests/test_input_rules.py::test_the_admin_consumer_form_refuses_what_the_issue_found",
    ),
    Guard(
        "admin consumer form: the timeout through its rule",
        "outbox/admin.py",
        '        return rules.form_value(rules.timeout_seconds, self.cleaned_data.get("timeout_seconds"))\n',
        '        return self.cleaned_data.get("timeout_seconds")\n',
        "tests/test_input_rules.py::test_the_admin_consumer_form_refuses_what_the_issue_found",
    ),
    Guard(
        "admin consumer form: event patterns are the field's error",
        "outbox/admin.py",
        "            return [check_event_pattern(pattern) for pattern in patterns]\n",
        "            return patterns\n",
        "tests/test_input_rules.py -k event_pattern",
    ),
    Guard(
        "admin passport form: operator id through its rule",
        "odal/admin.py",
        '        return rules.form_value(rules.operator_id, self.cleaned_data.get("operator_id"))\n',
        '        return self.cleaned_data.get("operator_id")\n',
        "tests/test_input_rules.py -k operator_id",
    ),
    Guard(
        "command line: a subcommand's usage error exits 2 under call_command",
        "odal/cli.py",
        '        raise CommandError(f"Error: {message}", returncode=2)\n',
        '        raise CommandError(f"Error: {message}", returncode=1)\n',
        "tests/test_cli.py::test_a_malformed_id_is_a_usage_error_on_every_command",
    ),
    Guard(
        "command line: a port in use is a sentence, exit 1",
        "odal/cli.py",
        "    except OSError as exc:\n",
        "    except ZeroDivisionError as exc:\n",
        "tests/test_input_rules.py::test_the_simulator_on_a_busy_port_says_so tests/test_input_rules.py::test_the_demo_receiver_on_a_busy_port_says_so",
    ),
    Guard(
        "odal up: the address is checked before anything starts",
        "odal/management/commands/up.py",
        "            addr = rules.address(addr)\n",
        "            addr = addr\n",
        "tests/test_input_rules.py::test_up_refuses_a_malformed_address_before_starting_anything",
    ),
    Guard(
        "odal outbox sweep: --batch through its rule",
        "outbox/management/commands/outbox.py",
        "type=argument(rules.batch_size), default=100",
        "type=int, default=100",
        "tests/test_input_rules.py -k batch_size",
    ),
    Guard(
        "sweep flush: a batch the database refuses is written again row by row",
        "outbox/sweep.py",
        "    except Exception:  # DataError, or psycopg refusing to encode: see which row, below\n",
        "    except ZeroDivisionError:\n",
        "tests/test_batch_isolation.py::test_an_unwritable_success_mid_batch_leaves_the_others_delivered_and_the_sweep_going",
    ),
    Guard(
        "sweep flush: a row that still cannot be written does not end the pass",
        "outbox/sweep.py",
        "            except Exception as exc:\n                settled.unwritten.add(f.delivery.pk)\n",
        "            except ZeroDivisionError as exc:\n                settled.unwritten.add(f.delivery.pk)\n",
        "tests/test_batch_isolation.py::test_an_unwritable_failure_mid_batch_leaves_the_other_failures_backed_off",
    ),
    Guard(
        "drain: an answer the database refuses does not end the drain",
        "registry/drain.py",
        "        except Exception as exc:\n            self.write_error(",
        "        except ZeroDivisionError as exc:\n            self.write_error(",
        "tests/test_batch_isolation.py::test_an_unwritable_registry_answer_leaves_the_drain_going",
    ),
    # -- issue 12, item 8: the guards the list lacked ----------------------------------------------
    Guard(
        "mark_delivered_each: reads the rows it takes under lock (the ids it returns are the rows it wrote)",
        "outbox/models.py",
        '            taken = set(self._held(token).select_for_update().values_list("pk", flat=True))\n',
        '            taken = set(self._held(token).values_list("pk", flat=True))\n',
        "tests/test_guards.py::test_the_bulk_delivered_write_reports_exactly_what_it_wrote_while_another_claim_takes_a_row",
    ),
    Guard(
        "mark_delivered_each: the UPDATE restates the guard (without row locks, a row another claim took is left alone)",
        "outbox/models.py",
        "                Delivery.objects.filter(pk__in=taken)._held(token).update(\n",
        "                Delivery.objects.filter(pk__in=taken).update(\n",
        "tests/test_guards.py::test_without_row_locks_the_bulk_delivered_write_still_takes_no_row_another_claim_holds",
    ),
    Guard(
        "terminal writes clear the claim token: outbox mark_delivered",
        "outbox/models.py",
        '            self._held(token).update(\n                status=Delivery.Status.DELIVERED, delivered_at=at, claim_token=None, last_error=""\n',
        '            self._held(token).update(\n                status=Delivery.Status.DELIVERED, delivered_at=at, last_error=""\n',
        "tests/test_guards.py::test_a_delivery_write_that_ends_the_attempt_leaves_the_row_unclaimed[mark_delivered]",
    ),
    Guard(
        "terminal writes clear the claim token: outbox mark_delivered_each",
        "outbox/models.py",
        '                    status=Delivery.Status.DELIVERED, delivered_at=at, claim_token=None, last_error=""\n',
        '                    status=Delivery.Status.DELIVERED, delivered_at=at, last_error=""\n',
        "tests/test_guards.py::test_a_delivery_write_that_ends_the_attempt_leaves_the_row_unclaimed[mark_delivered_each]",
    ),
    Guard(
        "terminal writes clear the claim token: outbox mark_attempt_failed",
        "outbox/models.py",
        "                next_attempt_at=retry_at,\n                claim_token=None,\n",
        "                next_attempt_at=retry_at,\n",
        "tests/test_guards.py::test_a_delivery_write_that_ends_the_attempt_leaves_the_row_unclaimed[mark_attempt_failed]",
    ),
    Guard(
        "terminal writes clear the claim token: outbox dead_letter_exhausted",
        "outbox/models.py",
        "                dead_at=now,\n                claim_token=None,\n",
        "                dead_at=now,\n",
        "tests/test_guards.py::test_a_delivery_write_that_ends_the_attempt_leaves_the_row_unclaimed[dead_letter_exhausted]",
    ),
    Guard(
        "replay: clears the claim token (a late attempt of the claim the row died under cannot end the replayed row's)",
        "outbox/models.py",
        "                dead_at=None,\n                claim_token=None,\n",
        "                dead_at=None,\n",
        "tests/test_guards.py::test_a_replayed_delivery_is_not_the_late_attempts_even_if_the_dead_row_kept_its_token",
    ),
    Guard(
        "replay: the UPDATE restates status=dead (without row locks, a row replayed meanwhile is not reset again)",
        "outbox/models.py",
        '                pk__in=[row["pk"] for row in before], status=Delivery.Status.DEAD\n',
        '                pk__in=[row["pk"] for row in before]\n',
        "tests/test_guards.py::test_without_row_locks_a_replay_racing_another_replay_refuses_and_writes_nothing",
    ),
    Guard(
        "replay: refuses (replay_conflict) and writes nothing when it took fewer rows than it read",
        "outbox/models.py",
        "            if taken != len(before):",
        "            if False:",
        "tests/test_guards.py::test_without_row_locks_a_replay_racing_another_replay_refuses_and_writes_nothing",
    ),
    Guard(
        "claim: the UPDATE restates 'still claimable' (without row locks, two claims never share a row)",
        "outbox/claims.py",
        "            self.model._default_manager.filter(pk__in=ids).claimable(now).update(\n",
        "            self.model._default_manager.filter(pk__in=ids).update(\n",
        "tests/test_guards.py::test_without_row_locks_two_claims_never_take_the_same_row",
    ),
    Guard(
        "terminal writes clear the claim token: registry mark_submitted (and mark_submitted_noting)",
        "registry/models.py",
        "                next_attempt_at=next_check_at,\n                claim_token=None,\n",
        "                next_attempt_at=next_check_at,\n",
        "tests/test_guards.py::test_every_drain_write_that_takes_its_row_leaves_it_unclaimed[mark_submitted]",
    ),
    Guard(
        "terminal writes clear the claim token: registry mark_registered",
        "registry/models.py",
        '                handle=handle,\n                claim_token=None,\n                last_error="",\n',
        '                handle=handle,\n                last_error="",\n',
        "tests/test_guards.py::test_every_drain_write_that_takes_its_row_leaves_it_unclaimed[mark_registered]",
    ),
    Guard(
        "terminal writes clear the claim token: registry mark_rejected",
        "registry/models.py",
        ".update(status=Registration.Status.REJECTED, claim_token=None, last_error=storable(errors))",
        ".update(status=Registration.Status.REJECTED, last_error=storable(errors))",
        "tests/test_guards.py::test_every_drain_write_that_takes_its_row_leaves_it_unclaimed[mark_rejected]",
    ),
    Guard(
        "terminal writes clear the claim token: registry mark_deactivated",
        "registry/models.py",
        '.update(status=Registration.Status.DEACTIVATED, claim_token=None, last_error="")',
        '.update(status=Registration.Status.DEACTIVATED, last_error="")',
        "tests/test_guards.py::test_every_drain_write_that_takes_its_row_leaves_it_unclaimed[mark_deactivated]",
    ),
    Guard(
        "terminal writes clear the claim token: registry mark_withdrawn",
        "registry/models.py",
        "                status=Registration.Status.SUSPENDED, claim_token=None\n",
        "                status=Registration.Status.SUSPENDED\n",
        "tests/test_guards.py::test_every_drain_write_that_takes_its_row_leaves_it_unclaimed[mark_withdrawn]",
    ),
    Guard(
        "terminal writes clear the claim token: registry mark_checked",
        "registry/models.py",
        "                next_attempt_at=next_check_at, claim_token=None\n",
        "                next_attempt_at=next_check_at\n",
        "tests/test_guards.py::test_every_drain_write_that_takes_its_row_leaves_it_unclaimed[mark_checked]",
    ),
    Guard(
        "terminal writes clear the claim token: registry mark_attempt_failed",
        "registry/models.py",
        "                next_attempt_at=retry_at, claim_token=None, last_error=storable(error)",
        "                next_attempt_at=retry_at, last_error=storable(error)",
        "tests/test_guards.py::test_a_register_that_failed_can_be_withdrawn_by_a_suspend_at_once",
    ),
    Guard(
        "terminal writes clear the claim token: registry cancel_deactivation (the drain's)",
        "registry/models.py",
        "            status=Registration.Status.REGISTERED,\n            operation=Registration.Operation.REGISTER,\n            claim_token=None,\n",
        "            status=Registration.Status.REGISTERED,\n            operation=Registration.Operation.REGISTER,\n",
        "tests/test_guards.py::test_every_drain_write_that_takes_its_row_leaves_it_unclaimed[cancel_deactivation]",
    ),
    Guard(
        "terminal writes clear the claim token: registry reregister (the drain's)",
        "registry/models.py",
        "        ).update(\n            operation=Registration.Operation.REGISTER,\n            attempts=0,\n            next_attempt_at=now,\n            queued_at=now,\n            claim_token=None,\n",
        "        ).update(\n            operation=Registration.Operation.REGISTER,\n            attempts=0,\n            next_attempt_at=now,\n            queued_at=now,\n",
        "tests/test_guards.py::test_every_drain_write_that_takes_its_row_leaves_it_unclaimed[reregister]",
    ),
    Guard(
        "registry mark_rejected: only the current claim token (its own guard, not the shared helper)",
        "registry/models.py",
        "            self.filter(claim_token=token)\n            .filter(\n",
        "            self.filter()\n            .filter(\n",
        "tests/test_registry_drain.py::test_no_drain_write_takes_a_row_held_by_another_claim[mark_rejected]",
    ),
    Guard(
        "registry drain writes: the operation (a register's answer never takes a deactivation, nor the reverse)",
        "registry/models.py",
        "        return rows.filter(operation=operation) if operation else rows\n",
        "        return rows\n",
        "tests/test_guards.py -k test_a_drain_write_for_one_operation_never_takes_a_row_owing_the_other",
    ),
    Guard(
        "re-publish: cancel_deactivation takes no row another claim holds (publishing's: none; the drain's: its own)",
        "registry/models.py",
        "            operation=Registration.Operation.DEACTIVATE,\n            claim_token=token,\n            attempts=0 if token is None else 1,\n",
        "            operation=Registration.Operation.DEACTIVATE,\n            attempts=0 if token is None else 1,\n",
        "tests/test_guards.py -k test_cancelling_a_deactivation_takes_no_row_another_claim_holds",
    ),
    Guard(
        "suspend: withdraw_unsent leaves a register an attempt holds to that attempt",
        "registry/models.py",
        "            claim_token__isnull=True,\n        ).update(status=Registration.Status.SUSPENDED)",
        "        ).update(status=Registration.Status.SUSPENDED)",
        "tests/test_guards.py::test_suspending_while_an_attempt_holds_the_register_leaves_it_to_that_attempt",
    ),
    Guard(
        "suspend: queue_deactivation takes only a registered row",
        "registry/models.py",
        "        return self.filter(status=Registration.Status.REGISTERED).update(\n",
        "        return self.filter().update(\n",
        "tests/test_registry_drain.py::test_suspended_while_checking_deactivates_once_registered",
    ),
    Guard(
        "re-publish: requeue leaves a pending row alone",
        "registry/models.py",
        "            status__in=[\n                Registration.Status.REJECTED,\n",
        "            status__in=[\n                Registration.Status.PENDING,\n                Registration.Status.REJECTED,\n",
        "tests/test_registry_drain.py::test_republish_leaves_live_registrations_alone[pending]",
    ),
    Guard(
        "re-publish: requeue leaves a submitted row alone",
        "registry/models.py",
        "            status__in=[\n                Registration.Status.REJECTED,\n",
        "            status__in=[\n                Registration.Status.SUBMITTED,\n                Registration.Status.REJECTED,\n",
        "tests/test_registry_drain.py::test_republish_leaves_live_registrations_alone[submitted]",
    ),
    Guard(
        "re-publish: requeue leaves a registered row alone",
        "registry/models.py",
        "            status__in=[\n                Registration.Status.REJECTED,\n",
        "            status__in=[\n                Registration.Status.REGISTERED,\n                Registration.Status.REJECTED,\n",
        "tests/test_registry_drain.py::test_republish_leaves_live_registrations_alone[registered]",
    ),
    Guard(
        "abandon: NotFound(exhaustive=false) is 422, not proof of absence",
        "registry/service.py",
        "    if not answer.exhaustive:\n",
        "    if False:\n",
        "tests/test_registry_api.py -k test_absence_not_proven_is_422",
    ),
    Guard(
        "abandon: Found is 409 naming the correlation id",
        "registry/service.py",
        "    if isinstance(answer, adapters.Found):\n",
        "    if isinstance(answer, adapters.Found):\n        return None\n",
        "tests/test_registry_api.py::test_found_is_409_naming_the_correlation_id",
    ),
    Guard(
        "abandon: Ambiguous is 409 naming the candidates",
        "registry/service.py",
        "    if isinstance(answer, adapters.Ambiguous):\n",
        "    if isinstance(answer, adapters.Ambiguous):\n        return None\n",
        "tests/test_registry_api.py::test_ambiguous_is_409_naming_the_candidates",
    ),
    Guard(
        "abandon: Unsupported is 422, not proof of absence",
        "registry/service.py",
        "    if isinstance(answer, adapters.Unsupported):\n",
        "    if isinstance(answer, adapters.Unsupported):\n        return None\n",
        "tests/test_registry_api.py -k test_absence_not_proven_is_422",
    ),
    Guard(
        "abandon: already abandoned is 200, nothing asked or written",
        "registry/service.py",
        "    if reg.status == Registration.Status.ABANDONED:\n        return AbandonResult(",
        "    if reg.status == Registration.Status.ABANDONED and False:\n        return AbandonResult(",
        "tests/test_registry_api.py::test_already_abandoned_is_200_and_asks_and_writes_nothing",
    ),
    Guard(
        "abandon: the reason is checked (422) before the registry is asked",
        "registry/service.py",
        "    reason = clean_reason(reason)\n    ask_registry(reg, adapter)\n",
        "    ask_registry(reg, adapter)\n",
        "tests/test_registry_api.py -k test_bad_reason_is_422_without_asking",
    ),
    Guard(
        "drain: a register whose passport is no longer published is withdrawn, never sent",
        "registry/drain.py",
        "    if reg.passport.status != Passport.Status.PUBLISHED:\n",
        "    if False:\n",
        "tests/test_registry_drain.py::test_the_drain_withdraws_a_register_whose_passport_was_suspended",
    ),
    Guard(
        "drain: the registered path queues the deactivation of a passport suspended meanwhile",
        "registry/drain.py",
        "            service.deactivate_if_suspended(reg)\n",
        "",
        "tests/test_registry_drain.py::test_suspended_while_checking_deactivates_once_registered",
    ),
    Guard(
        "passport publish: only a draft or suspended passport is published",
        "odal/models.py",
        "self.filter(status__in=[Passport.Status.DRAFT, Passport.Status.SUSPENDED]).update(",
        "self.all().update(",
        "tests/test_passports_api.py::test_publish_then_suspend_audits_each_change",
    ),
    Guard(
        "passport suspend: only a published passport is suspended",
        "odal/models.py",
        "        return self.filter(status=Passport.Status.PUBLISHED).update(\n",
        "        return self.all().update(\n",
        "tests/test_passports_api.py::test_suspending_a_draft_is_409",
    ),
    Guard(
        "tally: a delivery is counted when it becomes delivered, not on every write to a delivered row",
        "odal/migrations/0005_tally_and_heartbeats.py",
        "WHERE n.status = 'delivered' AND o.status <> 'delivered'",
        "WHERE n.status = 'delivered'",
        "tests/test_tally.py::test_a_delivery_is_counted_once_when_it_becomes_delivered_and_never_again",
    ),
    Guard(
        "tally: each session adds to rows of its own (no hot counter row)",
        "odal/migrations/0005_tally_and_heartbeats.py",
        "pg_backend_pid(), count(*)\n    FROM new_rows n JOIN old_rows o",
        "0, count(*)\n    FROM new_rows n JOIN old_rows o",
        "tests/test_tally.py::test_two_sessions_count_deliveries_of_one_consumer_at_once_without_waiting",
    ),
    Guard(
        "tally: a registration's move takes it out of its old status",
        "odal/migrations/0005_tally_and_heartbeats.py",
        "SELECT o.status, -1 AS d",
        "SELECT o.status, 0 AS d",
        "tests/test_tally.py::test_registration_status_figures_follow_every_move",
    ),
    Guard(
        "heartbeats: forgetting idle workers keeps each role's newest",
        "odal/tally.py",
        ".exclude(pk=Subquery(newest))",
        "",
        "tests/test_tally.py::test_forgetting_idle_workers_keeps_each_roles_newest",
    ),
    Guard(
        "admin lists: the count stops at the cap",
        "odal/admin.py",
        "    paginator = CappedPaginator\n",
        "",
        "tests/test_admin_lists.py::test_a_list_longer_than_the_cap_says_more_than_and_counts_no_further",
    ),
    Guard(
        "admin lists: no second count of the whole table",
        "odal/admin.py",
        "    show_full_result_count = False  # (another count of the whole table)\n",
        "",
        "tests/test_admin_lists.py::test_a_list_longer_than_the_cap_says_more_than_and_counts_no_further",
    ),
]


def run_tests(tests: str) -> bool:
    """True when the tests pass."""
    args = tests.split(" -k ")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "--create-db",
        *args[0].split(),
    ]
    if len(args) == 2:
        command += ["-k", args[1]]
    return subprocess.run(command, cwd=ROOT, capture_output=True).returncode == 0


def main() -> int:
    """`python tests/mutations.py [words…]`: only the guards whose name contains one of the words."""
    words = sys.argv[1:]
    guards = [g for g in GUARDS if not words or any(w in g.name for w in words)]
    survivors = []
    for guard in guards:
        path = ROOT / guard.path
        source = path.read_text()
        if source.count(guard.original) != 1:
            print(
                f"STALE  {guard.name}: its text is not found once in {guard.path}; update tests/mutations.py"
            )
            survivors.append(guard)
            continue
        mutated = source.replace(guard.original, guard.mutant)
        if guard.path.endswith(".py"):
            compile(mutated, guard.path, "exec")  # a mutant must be valid code, or "caught" means nothing
        started = time.monotonic()
        path.write_text(mutated)
        try:
            caught = not run_tests(guard.tests)
        finally:
            path.write_text(source)
        took = time.monotonic() - started
        print(
            f"{'caught' if caught else 'MISSED'}  {guard.name}  <- {guard.tests}  ({took:.1f}s)", flush=True
        )
        if not caught:
            survivors.append(guard)
    print(f"\n{len(guards) - len(survivors)} of {len(guards)} guards caught by a failing test.")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
