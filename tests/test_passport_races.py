"""Concurrent publish and suspend of one passport, with real threads and real commits (issue 17):
each answer matches what that call did, and the registration always follows the passport's
final status."""

import threading

import pytest
from django.db import connections

from odal.core.errors import Refused
from odal.core.models import Passport
from odal.surfaces import lifecycle
from registry.models import Registration
from tests.factories import PassportFactory

ROUNDS, THREADS = 40, 8


def call(passport, verb, start, answers):
    try:
        start.wait(10)
        try:
            result = getattr(lifecycle, verb)(passport.pk, actor="test")
            answers.append((verb, result.changed, result.detail, result.passport.status))
        except Refused as exc:
            answers.append((verb, False, exc.detail, None))
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_concurrent_publish_and_suspend_answer_what_they_did_and_the_registration_follows():
    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    wrong = []
    for round_ in range(ROUNDS):
        start, answers = threading.Barrier(THREADS), []
        threads = [
            threading.Thread(target=call, args=(passport, ("publish", "suspend")[i % 2], start, answers))
            for i in range(THREADS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for verb, changed, detail, status in answers:
            done = {"publish": "published", "suspend": "suspended"}[verb]
            if (changed or "already" in detail) and status != done:
                wrong.append(f"round {round_}: {verb} answered {detail!r} with status {status!r}")
        final = Passport.objects.get(pk=passport.pk).status
        reg = Registration.objects.get(passport=passport)
        expected = {"published": ("pending", "register"), "suspended": ("suspended", "register")}[final]
        if (reg.status, reg.operation) != expected:
            wrong.append(
                f"round {round_}: passport {final} but its registration is {reg.status} {reg.operation}"
            )
    assert not wrong, "\n".join(wrong[:10])


@pytest.mark.django_db(transaction=True)
def test_a_suspend_waits_for_a_publish_that_has_the_passport_and_so_each_answers_what_it_did(monkeypatch):
    """The interleaving the rounds above hope for, made to happen: a publish of a published
    passport (its UPDATE takes no row, so holds no lock of its own) is stopped right after it,
    and a suspend is started then. With the passport's row lock taken first, the suspend waits
    for the publish, which answers "already published" with the passport published. Without
    it, the suspend commits in between and the publish reads a passport it did not leave."""
    import time

    from django.db import connection

    passport = PassportFactory()
    lifecycle.publish(passport.pk, actor="test")
    at_read, go, answers = threading.Event(), threading.Event(), []
    real_get = lifecycle._get

    def held_get(dpp_id):
        if threading.current_thread().name == "publish":
            at_read.set()
            go.wait(30)
        return real_get(dpp_id)

    monkeypatch.setattr(lifecycle, "_get", held_get)
    publish = threading.Thread(
        target=call, args=(passport, "publish", threading.Barrier(1), answers), name="publish"
    )
    publish.start()
    assert at_read.wait(30)
    suspend = threading.Thread(
        target=call, args=(passport, "suspend", threading.Barrier(1), answers), name="suspend"
    )
    suspend.start()

    def suspend_is_waiting_on_a_lock() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            return cursor.fetchone()[0] > 0

    # Until the suspend has either finished (nothing stopped it) or waits on a lock (the publish's).
    deadline = time.monotonic() + 30
    while suspend.is_alive() and not suspend_is_waiting_on_a_lock() and time.monotonic() < deadline:
        time.sleep(0.02)
    go.set()
    publish.join(30)
    suspend.join(30)
    assert answers[0][0] == "publish", f"the suspend answered first: {answers}"
    verb, changed, detail, status = answers[0]
    assert "already published" in detail and status == "published", answers
    assert answers[1][:2] == ("suspend", True) and answers[1][3] == "suspended", answers
