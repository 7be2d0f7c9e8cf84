"""Run a command (the test suite) against PostgreSQL, finding one the way the README says:

1. DATABASE_URL if it is set (it must be a postgres:// URL);
2. else the server on 127.0.0.1:5432, if it answers;
3. else a throwaway cluster made with the local initdb/pg_ctl in a temporary folder, removed after;
4. else stop, saying how to get one.

Usage: python tests/pg.py -- pytest [args...]
"""

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile


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


def run_with_throwaway_cluster(command: list[str]) -> int:
    initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
    if not (initdb and pg_ctl):
        sys.stderr.write(
            "make test needs PostgreSQL and found none: DATABASE_URL is not set, nothing answers on "
            "127.0.0.1:5432, and initdb/pg_ctl are not installed.\n"
            "Start a server (e.g. `apt-get install postgresql` or `docker run -p 5432:5432 postgres`) "
            "or set DATABASE_URL=postgres://user@host:port/odal, then run make test again.\n"
        )
        return 2
    folder = tempfile.mkdtemp(prefix="odal-pg-")
    data = os.path.join(folder, "data")
    port = free_port()
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            sys.stderr.write("Running as root and there is no 'postgres' user to start PostgreSQL as.\n")
            return 2
        shutil.chown(folder, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    print(f"tests/pg.py: starting a throwaway PostgreSQL on port {port} in {folder}", flush=True)
    subprocess.run(
        [*as_user, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        [*as_user, pg_ctl, "-D", data, "-o", options, "-l", os.path.join(folder, "log"), "-w", "start"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        env = {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/odal"}
        return subprocess.call(command, env=env)
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", data, "-m", "fast", "-w", "stop"], stdout=subprocess.DEVNULL)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        sys.stderr.write(__doc__)
        return 2
    command = argv[argv.index("--") + 1 :]
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        if not url.startswith(("postgres://", "postgresql://")):
            sys.stderr.write(f"The test suite runs on PostgreSQL; DATABASE_URL is {url!r}.\n")
            return 2
        return subprocess.call(command)
    if answers("127.0.0.1", 5432) and not os.environ.get("ODAL_TEST_THROWAWAY_PG"):
        env = {**os.environ, "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/odal"}
        return subprocess.call(command, env=env)
    return run_with_throwaway_cluster(command)


if __name__ == "__main__":
    code = main(sys.argv)
    sys.exit(code)
