"""The one table of the claimed-work machine: when a kick last enqueued a woken task
(odal.work.wake). Its table is still `outbox_kick`: the model moved to the odal app from the outbox
app (a state-only migration), so that the machine, which the sweep and the registry drain both use,
depends on neither; it sits in the foundation, with the app's other models."""

from datetime import datetime, timedelta

from django.db import models
from django.utils import timezone


class KickQuerySet(models.QuerySet):
    def request(self, task: str, *, now: datetime | None = None, window_seconds: float) -> bool:
        """A commit wants `task` enqueued (no listener leads; odal.work.wake): True when it is the
        one to enqueue it, False when a kick for `task` is already on its way (enqueued less than
        `window_seconds` ago and not yet started). One guarded UPDATE; the row is made on first
        use. A burst of commits thus enqueues one task; a kick the broker lost holds back the
        next for `window_seconds` at most."""
        now = now or timezone.now()
        free = models.Q(enqueued_at__isnull=True) | models.Q(
            enqueued_at__lte=now - timedelta(seconds=window_seconds)
        )
        if self.filter(free, task=task).update(enqueued_at=now):
            return True
        _, made = self.get_or_create(task=task, defaults={"enqueued_at": now})  # first use, or a test's flush
        return made

    def withdraw(self, task: str, *, enqueued_at: datetime) -> int:
        """The broker refused the kick this commit took (request): a commit from now on tries
        again. Only that kick's mark is taken back, not a later one's."""
        return self.filter(task=task, enqueued_at=enqueued_at).update(enqueued_at=None)

    def started(self, task: str) -> int:
        """A task for `task` has started, before its first look at the table: a commit from
        now on may enqueue another (the one that started may already have looked past it)."""
        return self.filter(task=task, enqueued_at__isnull=False).update(enqueued_at=None)


class Kick(models.Model):
    """When a kick last enqueued a django-q2 task that has not started yet, per task
    (odal.work.wake): what keeps a burst of commits from enqueueing one task each."""

    task = models.CharField(max_length=200, primary_key=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)

    objects = KickQuerySet.as_manager()

    class Meta:
        db_table = "outbox_kick"

    def __str__(self) -> str:
        return f"{self.task} (enqueued {self.enqueued_at or 'none waiting'})"
