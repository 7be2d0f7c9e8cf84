"""What the benchmark runs: a Python consumer and a django-q2 task that do nothing, so both
measure only the machinery around them."""


def consume(event, delivery_id) -> None:
    return None


def task() -> None:
    return None
