"""A task the django-q2 clusters of tests/test_redis_broker.py run (by dotted path): it appends
its key and which cluster ran it to a file, so the test can see each task ran exactly once."""

import os


def record(key: str, path: str) -> None:
    # The cluster runs in a session of its own (start_new_session), so the process group is the
    # cluster's main process; the parent of a worker is the cluster's sentinel.
    with open(path, "a") as f:  # one short write in append mode: lines never interleave
        f.write(f"{key} {os.getpgrp()} {os.getppid()}\n")
