"""The Optuna storage a study lives in, shared safely by searches running at the same time.

Several searches (the nodes of a fleet, two terminals on one machine) may work on one study. Each running
trial beats a heartbeat into the storage (``heartbeat``); a trial whose search died stops beating and is
failed by the next search to ask for a trial (``fail_stale``), while a live search's trials are left alone.
A trial another search failed (it looked dead: a stall longer than the grace period) is never an error
here: ``tell`` and ``set_attr`` ignore it.

SQLite (a file under the work folder) is the default; PostgreSQL or MySQL URLs serve a fleet.
"""

from __future__ import annotations

import contextlib
import fcntl
import random
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.exceptions import UpdateFinishedTrialError

from autotune.errors import AutotuneError

HEARTBEAT_S = 10  # a running trial's beat period
GRACE_S = 60  # a running trial without a beat for this long belongs to a dead search
_T = TypeVar("_T")
CONNECT_TIMEOUT_S = 30  # SQLite: how long a writer waits for another's lock; servers: to connect


def storage_url(storage: str | None, workdir: Path) -> str:
    """The study's storage URL: ``storage``, else a SQLite file in ``workdir``."""
    if storage:
        return storage
    return f"sqlite:///{(Path(workdir) / 'studies.db').resolve()}"


def shown(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL at all: show it as given
        return url


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": CONNECT_TIMEOUT_S}}
    if url.startswith(("postgresql", "mysql")):
        return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}, "pool_pre_ping": True}
    return {}


def _cannot_open(url: str, exc: BaseException) -> AutotuneError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return AutotuneError(
        f"Cannot open the study storage {shown(url)}: {first}. Pass --storage a reachable database URL "
        "(sqlite:///PATH/studies.db, postgresql://USER@HOST/DB) or leave it out for a file under --workdir."
    )


def check_url(url: str) -> None:
    """Refuse, in one line, a storage that is not a database URL or that would vanish with the process."""
    if "://" not in url:
        raise AutotuneError(
            f"--storage {url!r} is not a database URL; use sqlite:///PATH/studies.db or postgresql://USER@HOST/DB."
        )
    if url.startswith("sqlite") and (url.rstrip("/").endswith(":") or ":memory:" in url or "mode=memory" in url
                                     or url.split("://", 1)[1] in ("", "/")):
        raise AutotuneError(
            f"--storage {url!r} is an in-memory SQLite database, gone when the search ends (and unseen by any "
            "other search); pass a file, sqlite:///PATH/studies.db, or leave --storage out."
        )


@contextlib.contextmanager
def _creating(url: str) -> Iterator[None]:
    """Serialise creating tables and studies in one SQLite file: searches started at once on a new work folder
    otherwise race in Optuna's schema set-up ("table alembic_version already exists"). The lock file lies
    beside the database; the kernel frees it if a search dies."""
    if not url.startswith("sqlite:///"):
        yield
        return
    path = Path(url[len("sqlite:///"):])
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


CREATE_ATTEMPTS = 6


def _creation_race(exc: BaseException) -> bool:
    """A server's answer to two searches creating the same table or study at once (PostgreSQL: a unique
    violation on its catalogue, or "already exists"): the other one won, so trying again finds its work."""
    seen: BaseException | None = exc
    while seen is not None:
        text = f"{type(seen).__name__}: {seen}"
        if any(mark in text for mark in ("UniqueViolation", "duplicate key", "already exists", "IntegrityError",
                                         "DuplicateTable", "DuplicateObject")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _retrying(make: Callable[[], _T]) -> _T:
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return make()
        except Exception as exc:
            if attempt == CREATE_ATTEMPTS - 1 or not _creation_race(exc):
                raise
            time.sleep(random.uniform(0.05, 0.3) * (attempt + 1))
    raise AssertionError("unreachable")


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """The storage at ``url`` with heartbeats on, tables created when new; AutotuneError (one line) when it
    cannot be opened (a bad URL, a server that is down, a missing driver, a folder that is not there).
    Any number of searches may open a new storage at once: creation is serialised (SQLite) or retried
    (a server), so each one opens it."""
    check_url(url)
    if url.startswith("sqlite:///"):
        folder = Path(url[len("sqlite:///"):]).parent
        if not folder.is_dir():
            raise _cannot_open(url, FileNotFoundError(f"no folder {folder}"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            with _creating(url):
                return _retrying(lambda: optuna.storages.RDBStorage(
                    url, engine_kwargs=_engine_kwargs(url), heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S))
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy, the driver and Optuna each raise their own
            raise _cannot_open(url, exc) from None


def create_study(storage: optuna.storages.RDBStorage, url: str, **kwargs: Any) -> optuna.Study:
    """``optuna.create_study(load_if_exists=True)`` that any number of searches may call at once."""
    with _creating(url):
        return _retrying(lambda: optuna.create_study(storage=storage, load_if_exists=True, **kwargs))


def open_existing_study(url: str, name: str) -> optuna.Study:
    """An existing study, for reading: nothing is created (no tables, no database file, no study). Raises
    LookupError with the reason when the storage or the study is not there."""
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if not path.is_file():
            raise LookupError(f"the study's storage {path} is not on this machine (moved, or tuned elsewhere)")
        url = f"sqlite:///file:{path.resolve()}?mode=ro&uri=true"  # read-only: SQLite writes nothing
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, **_engine_kwargs(url))
    try:
        with engine.connect() as connection:
            tables = set(sqlalchemy.inspect(connection).get_table_names())
    except Exception as exc:  # noqa: BLE001
        raise LookupError(f"the study's storage {shown(url)} cannot be opened ({type(exc).__name__})") from None
    finally:
        engine.dispose()
    if not {"studies", "trials", "version_info"} <= tables:
        raise LookupError(f"{shown(url)} holds no Optuna studies")
    storage = optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url), skip_table_creation=True,
                                         skip_compatibility_check=True)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise LookupError(f"the study {name} is not in {shown(url)}") from None


def fail_stale(study: optuna.Study) -> None:
    """Fail the running trials of searches that died (no heartbeat for GRACE_S); a live search's trials stay."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def ask(study: optuna.Study) -> optuna.Trial:
    """``study.ask()`` after failing dead searches' trials, as ``study.optimize`` does."""
    fail_stale(study)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        return study.ask()


@contextlib.contextmanager
def heartbeat(storage: optuna.storages.BaseStorage, study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat for ``trial`` in ``storage`` (the study's) now and every HEARTBEAT_S until the block ends (a thread;
    the trial itself runs in another process, so the beat never waits for it). No-op on storages without
    heartbeats."""
    if not isinstance(storage, optuna.storages.RDBStorage) or not storage.get_heartbeat_interval():
        yield
        return
    stop = threading.Event()
    interval = storage.get_heartbeat_interval()
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study.study_name), trial.number)

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # a lost connection: the next beat tries again
                storage.record_heartbeat(trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"autotune-heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(CONNECT_TIMEOUT_S)


def tell(study: optuna.Study, trial: optuna.Trial, value: float | None = None,
         state: optuna.trial.TrialState | None = None) -> None:
    """``study.tell`` that does nothing when another search already finished (failed) the trial."""
    try:
        study.tell(trial, value, state=state, skip_if_finished=True)
    except UpdateFinishedTrialError:  # failed by another search between tell's check and its write
        pass


def set_attr(trial: optuna.Trial, key: str, value: Any) -> None:
    """``trial.set_user_attr`` that does nothing when another search already finished the trial."""
    with contextlib.suppress(UpdateFinishedTrialError):
        trial.set_user_attr(key, value)


def report(trial: optuna.Trial, value: float, step: int) -> bool:
    """Report a partial figure and ask the pruner; True (stop) when another search already finished it."""
    try:
        trial.report(value, step)
    except UpdateFinishedTrialError:
        return True
    return trial.should_prune()
