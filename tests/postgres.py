"""Throw-away PostgreSQL cluster for pytest (works as root and as a normal user).

Verified on Debian 12, PostgreSQL 15.18 (/usr/lib/postgresql/15/bin), psycopg2-binary 2.9.13,
optuna 5.0.0, SQLAlchemy 2.0: start -> URL ready ~1.3 s, teardown ~0.2 s.

Use: ``from postgres import postgres_url`` in a test module (a session fixture), then

    def test_two_searches(postgres_url):  # "postgresql+psycopg2://postgres@127.0.0.1:PORT/autotune"
        ...

Why it looks like this:
* initdb/postgres refuse to run as root ("cannot be run as root"), so as root every server-side
  command runs as the `postgres` system user (subprocess's user=/group=, Python >= 3.9; no runuser/su
  needed) and the data dir is a fresh mkdtemp chowned to that user. pytest's tmp_path lives under
  /tmp/pytest-of-root (mode 0700) where `postgres` cannot even traverse, so it is NOT used.
* -k puts the unix socket in our own dir (Debian's default /var/run/postgresql may not exist or be
  writable); listen_addresses=127.0.0.1 + trust auth => no password in the URL.
* fsync/full_page_writes/synchronous_commit off and initdb --no-sync: speed only, data is disposable.
* Every subprocess call has a timeout; teardown always runs (stop -m immediate, then SIGKILL the
  postmaster from postmaster.pid if needed, then rmtree).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

_TIMEOUT = 60  # seconds, per subprocess call


def _bindir() -> str | None:
    """Directory holding initdb, pg_ctl and postgres, or None."""
    exe = shutil.which("pg_ctl")
    if exe and os.path.exists(os.path.join(os.path.dirname(os.path.realpath(exe)), "initdb")):
        return os.path.dirname(os.path.realpath(exe))  # /usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin
    # Debian keeps them off PATH (only the pg_wrapper client scripts are in /usr/bin).
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres_cluster(dbname: str = "autotune") -> Iterator[str]:
    """Start a private cluster, create `dbname`, yield its SQLAlchemy URL, then stop it and delete it."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        pytest.skip("psycopg2 not installed")

    run_as: dict = {}
    if os.geteuid() == 0:  # initdb/postgres refuse root: drop to the postgres user
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def sh(*args: str, timeout: float = _TIMEOUT, as_server: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [os.path.join(bindir, args[0]), *args[1:]],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, cwd=root,
            env={**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}, **(run_as if as_server else {}),
        )

    root = tempfile.mkdtemp(prefix="atpg-")  # short path: unix socket paths must stay < 108 bytes
    if run_as:
        os.chown(root, run_as["user"], run_as["group"])
    data, log = os.path.join(root, "data"), os.path.join(root, "server.log")
    port = _free_port()
    started = False
    try:
        r = sh("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync")
        if r.returncode != 0:
            pytest.skip(f"initdb failed: {r.stderr.strip()[-500:]}")
        opts = (f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c full_page_writes=off -c synchronous_commit=off -c max_connections=100")
        r = sh("pg_ctl", "-D", data, "-l", log, "-w", "-t", "30", "-o", opts, "start")
        started = True  # even on failure a postmaster may be up; teardown handles both
        if r.returncode != 0:
            tail = open(log).read()[-1000:] if os.path.exists(log) else ""
            pytest.skip(f"pg_ctl start failed: {r.stdout.strip()} {r.stderr.strip()} {tail}")
        r = sh("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", dbname, as_server=False)
        if r.returncode != 0:
            raise RuntimeError(f"createdb failed: {r.stderr.strip()}")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{dbname}"
    finally:
        if started:
            try:  # immediate: no checkpoint, disconnects clients at once (data is thrown away anyway)
                sh("pg_ctl", "-D", data, "-m", "immediate", "-w", "-t", "20", "stop", timeout=30)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(data, "postmaster.pid")) as f:
                    pid = int(f.readline())
                os.kill(pid, signal.SIGKILL)  # only if still there
                time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL of a private PostgreSQL database, e.g. postgresql+psycopg2://postgres@127.0.0.1:PORT/autotune.

    Session-scoped (one cluster per test run, ~1.5 s). A test that needs an empty database should use a
    unique optuna study name instead of a new cluster.
    """
    with postgres_cluster() as url:
        yield url
