"""`odal serve`: the production web entry. gunicorn runs odal's WSGI application (admin, API,
/metrics, probes) in worker processes; WhiteNoise, a middleware of odal's, serves the static files
`odal serve` collects first."""

import ipaddress
import json
import logging
import socket
import uuid

import gunicorn.util
from django.conf import settings
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from gunicorn.app.base import BaseApplication

from odal.core import rules
from odal.core.cli import serving, usage_error
from odal.core.env import DEFAULT_SECRET_KEY

logger = logging.getLogger(__name__)

# A worker answering abandon waits for the registry's whole task list (ODAL_REGISTRY_LOOKUP_SECONDS);
# gunicorn must not take that silence for a hung worker.
SLOWEST_REQUEST_MARGIN_SECONDS = 30


def admin_registry_seconds(web_timeout: float) -> int:
    """The admin's abandon asks the registry within ODAL_ADMIN_REGISTRY_SECONDS in all, and at
    most two thirds of the worker timeout gunicorn runs with (GUNICORN_CMD_ARGS may shorten it),
    so that its page comes before gunicorn kills the worker (0: gunicorn never does)."""
    if web_timeout <= 0:
        return settings.ODAL_ADMIN_REGISTRY_SECONDS
    return max(1, min(settings.ODAL_ADMIN_REGISTRY_SECONDS, int(web_timeout * 2 // 3)))


# What gunicorn answers itself (a request it cannot read never reaches Django), as the API's
# `{detail, code}`: status -> (code, detail). gunicorn's own message names the rule broken; it goes
# to gunicorn's log ("Invalid request from ip=…"), not back to the client.
GUNICORNS_OWN = {
    400: ("bad_request", "The request was refused as malformed: its request line, method, a header "
          "or its body's framing (Content-Length, Transfer-Encoding) is not HTTP/1.1 as RFC 9112 reads it"),
    403: ("forbidden", "The request was refused: its proxy line or forwarded scheme came from an "
          "address this server does not believe"),
    414: ("uri_too_long", "The request line is longer than this server reads (gunicorn's "
          "limit_request_line, 4,094 bytes): send long values in a body"),
    417: ("expectation_failed", "The request's Expect header asks for what this server does not do"),
    431: ("headers_too_large", "The request has more headers, or longer ones, than this server reads "
          "(gunicorn's limit_request_fields and limit_request_field_size)"),
    501: ("not_implemented", "The request's Transfer-Encoding is one this server does not read: send "
          "the body with a Content-Length, or chunked"),
}  # fmt: skip


def json_error(status: int, reason: str) -> bytes:
    """The whole answer to a request gunicorn refused itself: `{detail, code}`, as every error of
    the API is (a 500 with an `errorId` the log names too), and the connection closed."""
    if status in GUNICORNS_OWN:
        code, detail = GUNICORNS_OWN[status]
        body = {"detail": f"{detail}.", "code": code}
    elif status >= 500:
        error_id = uuid.uuid4().hex[:12]
        logger.error(
            "unexpected error %s: gunicorn answered %s %s (its traceback is above)", error_id, status, reason
        )
        body = {
            "detail": f"Something went wrong on our side; it was logged as error {error_id}. "
            "Try again later, or quote that id to the node's operator.",
            "code": "internal_error",
            "errorId": error_id,
        }
    else:
        body = {"detail": f"{reason}.", "code": "http_error"}
    content = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(content)}\r\n\r\n"
    )
    return head.encode("latin-1") + content


def write_json_error(sock, status_int, reason, mesg):
    """gunicorn's util.write_error (its HTML page), as JSON: see OdalApplication."""
    gunicorn.util.write_nonblock(sock, json_error(status_int, reason))


class OdalApplication(BaseApplication):
    """gunicorn's documented way to run an application from Python ("Custom Application"). Its
    configuration, each layer over the one before: odal's (ODAL_BIND, ODAL_WEB_WORKERS and the
    timeouts), then gunicorn's own GUNICORN_CMD_ARGS, then this command's --bind and --workers.

    A request gunicorn cannot read (a request line over 4 KB, a raw non-ASCII byte in the path,
    `Content-Length: -1`, a lower-case method…) is answered by gunicorn itself, before any path
    is trusted: its workers' handle_error writes it with `gunicorn.util.write_error`, an HTML
    page, and gunicorn has no setting or hook for it. odal serve puts write_json_error in its
    place before the workers are forked (every worker class calls it), so that those answers are
    the API's JSON `{detail, code}` too (docs/scaling.md)."""

    def __init__(self, defaults: dict, overrides: dict):
        self.defaults, self.overrides = defaults, overrides
        super().__init__(prog="odal serve")
        gunicorn.util.write_error = write_json_error

    def load_config(self):
        for name, value in self.defaults.items():
            self.cfg.set(name, value)
        from_env = self.cfg.parser().parse_args(self.cfg.get_cmd_args_from_env())
        for name, value in vars(from_env).items():
            if name != "args" and value is not None:
                self.cfg.set(name.lower(), value)
        for name, value in self.overrides.items():
            self.cfg.set(name, value)

    def load(self):  # in each worker, after the fork
        from odal.wsgi import application

        return application


def gunicorn_application(overrides: dict) -> OdalApplication:
    """odal's gunicorn application: odal's settings, then GUNICORN_CMD_ARGS, then `overrides`."""
    hold = settings.ODAL_REGISTRY_LOOKUP_SECONDS + SLOWEST_REQUEST_MARGIN_SECONDS
    return OdalApplication(
        defaults={
            "bind": [settings.ODAL_BIND],
            "workers": settings.ODAL_WEB_WORKERS,
            "proc_name": "odal",
            "timeout": hold,
            # After SIGTERM gunicorn lets requests in flight finish for this long, then ends its
            # workers: the whole server has exited within ODAL_STOP_SECONDS.
            "graceful_timeout": max(1, settings.ODAL_STOP_SECONDS - 1),
            # gunicorn's control socket has one default path per user: two `odal serve` on one
            # host would take it from each other.
            "control_socket_disable": True,
        },
        overrides=overrides,
    )


def development_line() -> str:
    """The one line `odal serve` says outside production: what that mode means here."""
    return (
        f"odal serve: development mode (ODAL_ENV={settings.ODAL_ENV}): DEBUG "
        f"{'on' if settings.DEBUG else 'off'}, "
        f"{'the development secret key' if settings.SECRET_KEY == DEFAULT_SECRET_KEY else 'your SECRET_KEY'}, "
        f"/metrics {'open' if not settings.ODAL_METRICS_TOKEN else 'behind its token'}, private webhook "
        f"targets {'allowed' if settings.ODAL_ALLOW_PRIVATE_WEBHOOKS else 'refused'}; loopback only. "
        "Set ODAL_ENV=production to serve other machines."
    )


def bound_host(address: str) -> str | None:
    """The host a gunicorn bind listens on (as gunicorn reads it: [v6]:port, host:port, or a host
    alone), or None for a Unix socket or an inherited file descriptor (unix:PATH, fd://N)."""
    if address.startswith(("unix:", "fd://")):
        return None
    address = address.removeprefix("tcp://")
    if address.startswith("["):
        return address[1 : address.find("]")] if "]" in address else address
    if address.count(":") == 1:
        return address.partition(":")[0]
    return address  # a host alone (gunicorn's port 8000), or an IPv6 address without brackets


def is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.partition("%")[0]).is_loopback
    except ValueError:
        return False  # another name: it may resolve anywhere


class Command(BaseCommand):
    help = (
        "Serve odal's web side (admin, API, /metrics) under gunicorn, with static files served by "
        "WhiteNoise: the production web entry. SIGTERM stops it gracefully (requests in flight finish, "
        "within ODAL_STOP_SECONDS)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--bind", help=f"HOST:PORT to listen on (default ODAL_BIND, {settings.ODAL_BIND})"
        )
        parser.add_argument(
            "--workers",
            help=f"worker processes, {rules.WEB_WORKERS[0]} to {rules.WEB_WORKERS[1]} "
            f"(default ODAL_WEB_WORKERS, {settings.ODAL_WEB_WORKERS})",
        )
        parser.add_argument(
            "--no-collectstatic",
            action="store_true",
            help="do not collect static files first (they were collected into STATIC_ROOT already)",
        )

    def handle(self, *args, bind, workers, no_collectstatic, **options):
        # Checked here, not by argparse, so that call_command too sees a usage error (exit 2).
        overrides = {}
        if bind is not None:
            try:
                overrides["bind"] = [rules.address(bind)]
            except ValueError as exc:
                raise usage_error("--bind", bind, exc) from None
        if workers is not None:
            try:
                overrides["workers"] = rules.web_workers(workers)
            except ValueError as exc:
                raise usage_error("--workers", workers, exc) from None
        app = gunicorn_application(overrides)
        if not settings.PRODUCTION:
            for address in app.cfg.bind:
                self.check_loopback(address)
        for address in app.cfg.bind:
            self.check_free(address)
        # Read by the forked workers (they inherit the settings as the master holds them).
        settings.ODAL_ADMIN_REGISTRY_SECONDS = admin_registry_seconds(app.cfg.timeout)
        if no_collectstatic:
            self.check_collected()
        else:
            call_command("collectstatic", interactive=False, verbosity=0)  # copies only what changed
        if not settings.PRODUCTION:
            self.stderr.write(development_line())
        self.stdout.write(
            f"odal serve: {app.cfg.workers} workers on {', '.join(app.cfg.bind)} "
            "(admin at /admin/, API at /vault/api/v1/); SIGTERM stops it gracefully "
            f"within {settings.ODAL_STOP_SECONDS}s. "
            f"Worker timeout {app.cfg.timeout:g}s; the admin's registry lookups end within "
            f"{settings.ODAL_ADMIN_REGISTRY_SECONDS}s."
        )
        self.stdout.flush()
        connections.close_all()  # forked workers must not share the master's connections
        app.run()
        # Nothing may follow: each worker returns through here (SystemExit) when it stops.

    def check_collected(self):
        """With --no-collectstatic, the hashed names of production's storage need its manifest:
        without one every admin page would fail, so refuse to start instead."""
        if hasattr(staticfiles_storage, "read_manifest") and staticfiles_storage.read_manifest() is None:
            raise CommandError(
                f"No static files were collected into {settings.STATIC_ROOT}: run `odal collectstatic` "
                "first, or start without --no-collectstatic.",
                returncode=1,
            )

    def check_loopback(self, address: str):
        """Outside production odal serve listens on this machine only: its development settings
        (DEBUG, the development key, an open /metrics, private webhook targets) are no one else's."""
        host = bound_host(address)
        if host is None or is_loopback(host):
            return
        raise CommandError(
            f"odal serve runs in development here (ODAL_ENV is not production) and listens on "
            f"loopback only, not on {address} (from --bind, ODAL_BIND or GUNICORN_CMD_ARGS). To serve "
            "other machines, run it in production: ODAL_ENV=production with SECRET_KEY, "
            "ALLOWED_HOSTS and ODAL_METRICS_TOKEN set (see docs/runbook.md).",
            returncode=1,
        )

    def check_free(self, address: str):
        """A refusal now (exit 1) if the address cannot be listened on, instead of gunicorn's
        five retries and a log line. Other kinds of address are gunicorn's to check."""
        try:
            host, _, port = rules.address(address).rpartition(":")
        except ValueError:  # unix:PATH, fd://N or a host alone, from GUNICORN_CMD_ARGS
            return

        def bind():
            family, kind, proto, _, where = socket.getaddrinfo(
                host.strip("[]"), int(port), type=socket.SOCK_STREAM
            )[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
                probe.bind(where)

        serving(bind, int(port), "web server", option="--bind")
