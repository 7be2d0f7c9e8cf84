"""Run by bench/run.py in a process of its own: sweep `--passes` passes of `--batch` no-op
deliveries, timing each claim and each pass, then print JSON with the median and worst claim
time, the claims' share of the passes' time, and the process's peak RSS. The benchmark runs it over tables of different sizes."""

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "odal.settings")
    import django

    django.setup()
    from outbox.models import DeliveryQuerySet
    from outbox.sweep import sweep_once, sweeper

    timings: list[float] = []
    claim = DeliveryQuerySet.claim

    def timed_claim(self, **kwargs):
        started = time.perf_counter()
        try:
            return claim(self, **kwargs)
        finally:
            timings.append((time.perf_counter() - started) * 1000)

    DeliveryQuerySet.claim = timed_claim
    delivered, passes = 0, []
    with sweeper() as shared:  # as a running sweep does: one webhook client and Python thread
        for _ in range(args.passes):
            started = time.perf_counter()
            delivered += sweep_once(batch=args.batch, **shared).delivered
            passes.append((time.perf_counter() - started) * 1000)
    print(
        json.dumps(
            {
                "claim_ms": timings,
                "claim_ms_median": statistics.median(timings),
                "claim_ms_max": max(timings),
                "claim_share": sum(timings) / sum(passes),  # of the passes' whole time, claims included
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "delivered": delivered,
            }
        )
    )


if __name__ == "__main__":
    main()
