"""The Prometheus registry behind /metrics.

Collectors read their figures from the database at scrape time (see each app's metrics module):
attempts are made in worker processes, so in-process counters would show only the web
process's share.
"""

from prometheus_client import CollectorRegistry

registry = CollectorRegistry(auto_describe=False)  # collectors query the database: not at start-up


def register(collector) -> None:
    registry.register(collector)
