import functools

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.utils import timezone

from odal.core.models import ApiToken, Passport


class PassportFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Passport

    upi = factory.Sequence(lambda n: f"https://id.example.eu/01/09506000134352/21/SER-{n:05d}")
    operator_id = "OP-1"
    facility_id = "FAC-1"
    commodity_code = "8507 60"


class PublishedPassportFactory(PassportFactory):
    status = Passport.Status.PUBLISHED


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()

    username = factory.Sequence(lambda n: f"staff{n}")
    is_staff = True
    password = factory.LazyFunction(lambda: password_hash("pw-for-tests"))


@functools.cache
def password_hash(password: str) -> str:
    """The hash of `password`, made once per run: a PBKDF2 hash costs a fifth of a second, and
    every user made with it still logs in with that password (the salt is in the hash)."""
    return make_password(password)


def issue_token(scope: str = "admin", name: str | None = None) -> str:
    """A live API token's plaintext."""
    _, plaintext = ApiToken.objects.issue(name=name or f"test-{scope}", scope=scope)
    return plaintext


class ConsumerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "outbox.Consumer"

    name = factory.Sequence(lambda n: f"consumer-{n}")
    kind = "python"
    target = "tests.consumers.accept"
    max_attempts = 3
    timeout_seconds = 2


class WebhookConsumerFactory(ConsumerFactory):
    kind = "webhook"
    target = ""
    url = "http://127.0.0.1:9/hooks"


class EventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "outbox.Event"

    type = "passport.published"
    payload = factory.LazyAttribute(lambda o: {"n": 1})


class DeliveryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "outbox.Delivery"

    event = factory.SubFactory(EventFactory)
    event_type = factory.LazyAttribute(lambda o: o.event.type)  # (as emit copies it)
    consumer = factory.SubFactory(ConsumerFactory)
    max_attempts = factory.LazyAttribute(lambda o: o.consumer.max_attempts)


class DeadDeliveryFactory(DeliveryFactory):
    status = "dead"
    attempts = 3
    last_error = "HTTP 500: upstream exploded"
    dead_at = factory.LazyFunction(timezone.now)


class RegistrationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "registry.Registration"

    passport = factory.SubFactory(PublishedPassportFactory)


def backed_off_registration(**fields):
    """A pending register row that has been tried, failed, and waits for its next attempt: the
    only kind abandon may take."""
    from datetime import timedelta

    defaults = {
        "attempts": 2,
        "next_attempt_at": timezone.now() + timedelta(minutes=10),
        "last_error": "registry answered HTTP 503",
    }
    return RegistrationFactory(**{**defaults, **fields})
