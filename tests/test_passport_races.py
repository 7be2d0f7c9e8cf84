"""Concurrent publish and suspend of one passport, with real threads and real commits (issue 17):
each answer matches what that call did, and the registration always follows the passport's
final status."""

import threading

import pytest
from django.db import connections

from odal import lifecycle
from odal.errors import Refused
from odal.models import Passport
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
