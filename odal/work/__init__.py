"""Claimed work: the one machine under the outbox's delivery sweep and the registry's drain.

- claims.py: the claim (one guarded UPDATE of a batch of due rows, a token and a hold each), the
  release of rows whose attempt never started, and the backoff.
- wake.py: waking a worker when a commit creates due work (NOTIFY to the listening
  worker, or one coalesced django-q2 task when none listens), and the task a kick runs (its table:
  odal.core.kicks).
- http.py: HTTP whose every request ends by its deadline (the webhooks' and the registry's).

Neither kind of work is imported here: each says what its attempts are (outbox.sweep,
registry.drain) and uses these.
"""
