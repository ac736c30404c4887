"""Run each trial in a fresh process that the search can always stop.

A trial process is forked from a forkserver that imported torch but never ran an OpenMP region, so
it starts in ~0.2 s, starts clean (allocator state, thread pools, mallopt settings do not leak from one
candidate to the next), and can be killed with all its DataLoader workers when it crashes, hangs,
overruns its time, exceeds the memory budget, or is pruned.

A broken trial never stops the search: every way a trial ends is a ``TrialFailed`` or ``TrialPruned``
the search records. That holds for the kernel's OOM killer too: the trial process and the forkserver
make themselves its first choice (``machine._oom``: the trial's DataLoader workers, and any forkserver or
spawned process it starts, inherit the score), so an OOM in the job ends a trial, never the search, and
a trial that died of one is recorded with one line naming the job's memory limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import re
import signal
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import psutil

from autotune._units import format_bytes
from autotune.caches import ensure_root, remove_leftovers, remove_trial_folder, trial_folder
from autotune.config import LoaderConfig
from autotune.loader import READING
from autotune.machine import job_memory, make_expendable, oom_kills, process_uss, tree_memory, tree_rss
from autotune.process import Preloaded, get_allocator, launch_env, mapped_paths
from autotune.tuner._lifecycle import stop_held, stop_or_hold, watch_parent
from autotune.tuner._measure import Plan, TrialStopped, Workload, measure
from autotune.tuner._measurement import Measurement

_INHERITED: Workload | None = None  # the fork fallback hands the workload over by inheritance


_PRELOAD = ["torch", "autotune.tuner._measure"]


def warm_forkserver() -> None:
    """Start the trial forkserver now, so its import of torch overlaps the search's preparation instead of
    delaying (and inflating the duration of) the first trial."""
    try:
        from multiprocessing import forkserver

        multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
        forkserver.ensure_running()
        _expendable_forkserver()
    except Exception:  # noqa: BLE001 - no forkserver here: the runner falls back as it always did
        pass


def forkserver_pid() -> int | None:
    """The pid of this process's multiprocessing forkserver, None when none runs."""
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # private: there is no public way to ask
        pid = server._forkserver_pid
    except Exception:  # noqa: BLE001 - another Python's internals
        return None
    return int(pid) if pid else None


def waiting_forkserver() -> int | None:
    """The forkserver's pid once it has imported its preload and waits for requests (asleep in its poll),
    None while it still imports, or where none runs (``/proc/PID/wchan``; Linux)."""
    pid = forkserver_pid()
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/wchan") as f:
            waits = f.read()
    except OSError:
        return None
    return pid if "poll" in waits or "select" in waits else None


def _expendable_forkserver() -> None:
    """The trials' forkserver is the OOM killer's first choice too (``machine._oom``): it holds a whole
    interpreter, and multiprocessing starts a new one when it is gone. Raised from outside: nothing runs in
    it before its preload, and a new one is started whenever the old one died."""
    pid = forkserver_pid()
    if pid is not None:
        make_expendable(pid)


def _probe_main(conn: Any) -> None:
    """Forked from the trials' forkserver as a trial is, it starts its own resource tracker as a trial does
    (``_own_resource_tracker``) and writes what a running process writes of the interpreter it shares (the
    collector walks every object, writing each one's header, as a trial's or a worker's collections do), then
    waits to be measured; it sends its tracker's pid (0 where it has none)."""
    import gc

    make_expendable()
    _own_resource_tracker()
    gc.collect()
    try:
        conn.send(("ready", _tracker_pid()))
        conn.recv()
    except (OSError, EOFError):
        pass  # the search stopped before measuring it (its budget ran out, a signal): nothing to report


@dataclasses.dataclass(frozen=True)
class ForkCharges:
    """Measured at the search's start: the trials' forkserver's own memory (USS: what a fresh interpreter with
    the trial's imports holds, as a spawned trial or worker does) and what a process forked from it adds to
    the job once it has run (``tree_memory(...).added``: the guard's accounting), the plan's heap of a trial
    and of each forked worker, less its resource tracker, which a trial holds once and a worker does not (what the
    tracker's process holds: ``tracker``; the guard counts it, an exec'd process of the trial's tree)."""

    interpreter: int
    forked: int
    tracker: int = 0  # the trial's own resource tracker, an exec'd interpreter (``_own_resource_tracker``)


def fork_charges(ready_within: float = 120.0) -> ForkCharges:
    """Measure ``ForkCharges`` here: start the trials' forkserver if it is not, wait until it has imported its
    preload, fork one probe from it and read what the probe adds."""
    from multiprocessing import forkserver

    ctx: Any = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    forkserver.ensure_running()
    _expendable_forkserver()
    deadline = time.monotonic() + ready_within
    while waiting_forkserver() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # still importing its preload
    server = forkserver_pid()
    receiver, sender = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_probe_main, args=(sender,), name="autotune-memory-probe")
    proc.start()
    sender.close()
    try:
        _, tracker_pid = receiver.recv()
        if tracker_pid:
            _settled(tracker_pid)  # started, not waited for: it may still be importing
        forked = tree_memory(proc.pid, forked_from=server).added
        tracker = tree_memory(tracker_pid).pss if tracker_pid else 0
        receiver.send("done")
    finally:
        _end_probe(receiver, proc)
    return ForkCharges(interpreter=process_uss(server), forked=max(0, forked - tracker), tracker=tracker)


def _end_probe(receiver: Any, proc: Any) -> None:
    """Let a memory probe exit (it was told "done", or its reader failed), and end it where it does not."""
    receiver.close()
    proc.join(10)
    if proc.is_alive() and proc.pid:
        kill_tree(proc.pid)


def _spawned_probe_main(conn: Any, start_method: str) -> None:
    """Spawned with a preloaded allocator as such a trial is (``Runner._context_for``), it starts its resource
    tracker (under the same preload) and takes the search's start method as a trial does, then runs a full
    collection and waits to be measured; asked, it forks one child that collects too (the build's read workers
    and the loader's forked workers are such children) and names it; it sends its tracker's pid first."""
    import gc

    make_expendable()
    _own_resource_tracker()
    _start_as_the_search(start_method)
    gc.collect()
    child = 0
    try:
        conn.send(("ready", _tracker_pid()))
        if conn.recv() == "fork":
            ready, written = os.pipe()
            child = os.fork()
            if child == 0:
                os.close(ready)
                gc.collect()
                os.write(written, b"1")
                conn.recv()  # the search's "done", or its end: either is the child's
                os._exit(0)
            os.close(written)
            os.read(ready, 1)
            conn.send(("forked", child))
            conn.recv()
    except (OSError, EOFError):
        pass  # the search stopped before measuring it: nothing to report
    finally:
        if child:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)


def spawn_charges(config: LoaderConfig, ready_within: float = 120.0) -> ForkCharges:
    """``ForkCharges`` for a trial of ``config``'s preloaded allocator, which is spawned under its preload
    instead of forked (``Runner._context_for``), measured as the guard reads such a trial's tree (its PSS: it
    shares no server's pages): a probe spawned the same way, its own process (``interpreter``: what it holds
    once it has run, less its tracker), its resource tracker under the preload (``tracker``), and what a child
    forked from it adds once it has run (``forked``: each forked read worker or DataLoader worker of the trial)."""
    ctx: Any = multiprocessing.get_context("spawn")
    settings = config.process_settings()
    env, notes = launch_env(settings, os.environ)
    if notes:
        raise RuntimeError("; ".join(notes))  # no trial of it starts either (``Runner._context_for``)
    receiver, sender = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_spawned_probe_main, args=(sender, search_start_method()),
                       name="autotune-memory-probe")
    with _environment(env):
        proc.start()
    sender.close()
    try:
        if not receiver.poll(ready_within):
            raise RuntimeError("the spawned memory probe did not start in time")
        _, tracker_pid = receiver.recv()
        allocator = get_allocator(settings.allocator)
        if isinstance(allocator, type) and issubclass(allocator, Preloaded) and not allocator.loaded(
                mapped_paths(f"/proc/{proc.pid}/maps")):
            raise RuntimeError(f"the spawned memory probe has no {settings.allocator} loaded")
        if tracker_pid:
            _settled(tracker_pid)
        tracker = tree_memory(tracker_pid).pss if tracker_pid else 0
        own = tree_memory(proc.pid).pss - tracker
        receiver.send("fork")
        _, child = receiver.recv()
        forked = tree_memory(child, forked_from=proc.pid).added
        receiver.send("done")
    finally:
        _end_probe(receiver, proc)
    return ForkCharges(interpreter=max(0, own), forked=forked, tracker=tracker)


class SpawnedCharges:
    """``spawn_charges`` by allocator name, measured the first time a trial of that allocator is planned and
    kept for the search (the plan's ``TrialMemory.spawned``): a search that tries no preloaded allocator spawns
    no probe. Where none can be spawned, ``fallback``'s figures stand in, as a forked trial's plus an
    interpreter."""

    def __init__(self, fallback: ForkCharges):
        self.fallback = fallback
        self.figures: dict[str, ForkCharges] = {}

    def __call__(self, allocator: str) -> ForkCharges:
        if allocator not in self.figures:
            try:
                self.figures[allocator] = spawn_charges(LoaderConfig(allocator=allocator))
            except (OSError, EOFError, RuntimeError, ValueError):
                f = self.fallback
                self.figures[allocator] = ForkCharges(f.interpreter + f.forked, f.forked, f.tracker)
        return self.figures[allocator]


class TrialFailed(Exception):
    """The candidate could not be measured; the message is the reason recorded on the trial."""


class TrialTimedOut(TrialFailed):
    """The candidate was still running when its limit ran out. Whether that says anything about it depends on
    who set the limit: the plan's is a hung worker or a very slow candidate, the wall's only that the budget
    ended (``tuner/_study.py``: a finalist's run the wall stopped keeps the finalist in the choice)."""


class TrialPruned(Exception):
    """The pruner stopped the candidate early: its partial figure was hopeless."""


def failure_reason(exc: BaseException) -> str:
    """A one-line reason for a failed candidate, naming the likely cause where it is a known one."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "Bus error" in str(exc) or "SIGBUS" in str(exc):
        return ("a worker died of a bus error: /dev/shm is too small for workers x prefetch_factor x "
                "batch bytes (Docker: --shm-size)")
    if "exited unexpectedly" in text or "killed by signal" in text:
        return (f"{text}: a worker crashed (a bus error from a small /dev/shm, a segfault in native code, or "
                "the out-of-memory killer)")
    if isinstance(exc, MemoryError):
        return "out of memory"
    if "timed out" in text.lower():
        return f"a batch did not arrive in time ({text})"
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if len(lines) > 1 and "Original Traceback" in str(exc):
        # A worker's exception: keep where it happened and what the user's code raised.
        return f"{lines[0].removeprefix('Caught ').rstrip('.')}: {lines[-1]}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_TRIAL_PID = 0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    if os.getpid() != _TRIAL_PID:
        os._exit(143)  # a forked DataLoader worker inherited this handler: just go
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # once: unwinding must not be interrupted again
    stop_or_hold(143)  # unwinds through the DataLoader iterator (once it is whole), which stops its workers cleanly


def _hold_stops_while_workers_start() -> None:
    """In a trial process (ours, never the user's), every DataLoader iterator of the trial, its epochs' and its
    cache builds', is built whole before a stop unwinds it (``_lifecycle.stop_held``): interrupted after its
    first worker started and before its status list was set, its ``__del__`` failed ("Exception ignored ...
    '_workers_status'") when the trial, having caught the stop, collected it."""
    from torch.utils.data import dataloader

    cls: Any = dataloader._MultiProcessingDataLoaderIter
    init = cls.__init__
    if getattr(init, "_autotune_held", False):
        return

    def held(self: Any, *args: Any, **kwargs: Any) -> None:
        with stop_held():
            init(self, *args, **kwargs)

    held._autotune_held = True  # type: ignore[attr-defined]
    cls.__init__ = held


_READING_LINE = re.compile(r"^autotune-reading: dataset\[(\d+)\] for ([\d.]+) s$", re.M)


def _say_reading(signum: int, frame: Any) -> None:
    """SIGUSR1 in a trial or its forked worker: write the index being read, if any, to the trial's log."""
    now = READING[0]
    if now is not None:
        os.write(2, f"autotune-reading: dataset[{now[0]}] for {time.monotonic() - now[1]:.1f} s\n".encode())


def what_hangs(pids: list[int], logs: list[str | None], wait: float = 0.5) -> str:
    """Ask every process of the trials' trees which index it is reading (SIGUSR1) and name the one read
    longest, from their logs; "" when none says (a read inside a cache, a spawned worker)."""
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                if not _is_tracker(proc):
                    with contextlib.suppress(psutil.Error, OSError):
                        proc.send_signal(signal.SIGUSR1)
    time.sleep(wait)
    found: list[tuple[float, int]] = []
    for log in logs:
        if log:
            with contextlib.suppress(OSError):
                with open(log, errors="replace") as f:
                    found += [(float(s), int(i)) for i, s in _READING_LINE.findall(f.read()[-65536:])]
    seconds, index = max(found, default=(0.0, -1))
    if seconds < 1.0:
        return ""  # a read that just began: a slow candidate, not a hang
    return f"dataset[{index}] had not returned after {seconds:.0f} s (a read that hangs?)"


def _trial_main(conn: Any, workload_file: str | None, sys_path: list[str], config: dict[str, Any], plan: Plan,
                fork_fallback: bool, log_path: str | None = None, together: bool = False,
                start_method: str | None = None) -> None:
    if log_path:
        # The trial's and its workers' prints (torch's worker errors, C++ aborts) go to its log, not
        # the user's terminal; file descriptors, so output from native code follows too.
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    global _TRIAL_PID
    _TRIAL_PID = os.getpid()
    make_expendable()  # before the workload is unpickled: the kernel ends this tree, not the search (machine._oom)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.signal(signal.SIGUSR1, _say_reading)  # forked workers inherit it
    _hold_stops_while_workers_start()
    _release_forkserver()
    watch_parent(os.getppid())  # the search died without stopping us (SIGKILL): take the workers along
    _own_resource_tracker()
    if start_method:
        _start_as_the_search(start_method)
    for folder in reversed(sys_path):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        if fork_fallback:
            import torch

            torch.set_num_threads(1)  # the parent may have used OpenMP, which is not fork-safe
        if workload_file is None:
            workload = _INHERITED
        else:
            with open(workload_file, "rb") as f:
                workload = pickle.load(f)
        assert workload is not None, "a forked trial inherits the workload the runner set"
        conn.send(("ready",))  # the give-up clock starts here, not while the dataset is unpickled
        if together and conn.recv() != "go":
            return  # ranks start measuring together, as a torchrun job's ranks leave their rendezvous together
        result = measure(workload, LoaderConfig.from_json(config), plan,
                         report=lambda step, value: conn.send(("progress", step, value)),
                         should_stop=conn.poll)  # the only message the search sends is "stop"
        conn.send(("result", result))
    except (SystemExit, TrialStopped):
        pass  # stopped by the search (pruned, timed out): nobody is listening any more
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the trial's reason
        try:
            conn.send(("error", failure_reason(exc)))
        except OSError:
            pass
    finally:
        conn.close()


def search_start_method() -> str:
    """The start method a DataLoader without ``multiprocessing_context`` uses in the search's process (the
    user's), without fixing it there: the one set, else the interpreter's default."""
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def _start_as_the_search(method: str) -> None:
    """Make ``method`` this trial's default start method. A process the forkserver starts has the
    forkserver's as its default, not its search's: every DataLoader the trial starts without a context (a
    cache build's read workers) started a new forkserver, importing torch, where the user's process forks
    (3.1-3.6 s of a 3.2-3.7 s build of 6 samples in a 1.2 GiB cgroup at load ~5, against 0.06 s forked)."""
    with contextlib.suppress(ValueError, RuntimeError):
        multiprocessing.set_start_method(method, force=True)


def _release_forkserver() -> None:
    """Close this trial's copy of the search's forkserver "alive" pipe.

    The forkserver exits when every holder of that pipe is gone, and every process it forks inherits a
    copy: kept open, a trial would keep the forkserver (its parent) alive after the search was killed, and
    so never see its parent die. A trial whose DataLoader wants a forkserver starts its own.
    """
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # private: there is no public way to drop the pipe
        if server._forkserver_alive_fd is not None:
            with contextlib.suppress(OSError):
                os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
        server._forkserver_pid = None
        server._forkserver_address = None
    except Exception:  # noqa: BLE001 - another Python's internals: the watch thread still covers spawn
        pass


def _own_resource_tracker() -> None:
    """Give this trial its own multiprocessing resource tracker instead of the search's.

    The semaphores of a DataLoader's queues (spawn and forkserver workers) are registered with a tracker;
    a trial killed before it unregisters them would leave them to the search's tracker, which warns
    "leaked semaphore objects" when the search ends. The trial's own tracker outlives the trial
    (``kill_tree`` spares it), removes what a killed trial left, notes it in the trial's log, and exits.
    """
    try:
        from multiprocessing import resource_tracker

        tracker: Any = resource_tracker._resource_tracker  # private: nor to leave a tracker
        with tracker._lock:
            if tracker._fd is not None:
                os.close(tracker._fd)  # the search's tracker: inherited, not ours to hold
            tracker._fd = None
            tracker._pid = None
        tracker.ensure_running()
    except Exception:  # noqa: BLE001 - another Python's internals: keep the shared tracker
        pass


def _settled(pid: int, every: float = 0.05, within: float = 5.0) -> None:
    """Return once ``pid``'s memory reads the same twice ``every`` seconds apart (a process that finished starting
    and waits), or after ``within`` seconds."""
    last, deadline = -1, time.monotonic() + within
    while time.monotonic() < deadline:
        now = tree_memory(pid).pss
        if now == last:
            return
        last = now
        time.sleep(every)


def _tracker_pid() -> int:
    """The pid of this process's multiprocessing resource tracker, 0 when none runs."""
    try:
        from multiprocessing import resource_tracker

        return int(resource_tracker._resource_tracker._pid or 0)  # type: ignore[attr-defined]  # private
    except Exception:  # noqa: BLE001 - another Python's internals
        return 0


def _is_tracker(proc: psutil.Process) -> bool:
    try:
        return any("resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def kill_tree(pid: int, grace: float = 3.0) -> None:
    """Stop a trial process and every descendant (its DataLoader workers).

    SIGTERM first, so the trial unwinds and releases its workers' semaphores and shared memory; SIGKILL
    for whatever is left after ``grace`` seconds (a hung worker, a process stuck in C code). The trial's
    resource tracker is spared: it exits by itself once the others are gone, after removing what they left.
    """
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    trackers = [p for p in procs if _is_tracker(p)]
    procs = [p for p in procs if p not in trackers]
    try:
        root.terminate()
    except psutil.NoSuchProcess:
        pass
    _ended(pid, grace)
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    _ended(pid, 10)
    psutil.wait_procs([p for p in procs if p.pid != pid], timeout=10)
    psutil.wait_procs(trackers, timeout=5)


def _ended(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``pid`` to end, without reaping it where it is this process's child.

    Its ``multiprocessing.Process`` must be the one to reap it: once another wait (psutil's) has, that
    object's poll reads ECHILD as "not started yet" and counts the process alive for ever, in
    ``active_children()`` and ``is_alive()`` alike.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return  # ended, left for its owner to reap
        except ChildProcessError:  # not this process's child: psutil's wait only polls for it
            with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
                psutil.Process(pid).wait(max(0.0, deadline - time.monotonic()))
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def ended_by_a_kill(exc: BaseException) -> bool:
    """Whether a trial's failure is one of its processes ending by SIGKILL that autotune did not send: the trial
    process, a DataLoader worker (torch's two messages), or the trials' forkserver (a start or a pipe the
    server's death broke). Only such a failure can be the OOM killer's: the kernel's count of OOM kills grows
    for any process in the job, or on the host, and on a shared machine another job's kill lands in the same
    window as a trial that timed out, was stopped by the guard, or raised. Those keep their own reason."""
    if isinstance(exc, (OSError, EOFError)):
        return True
    if isinstance(exc, TrialTimedOut) or not isinstance(exc, TrialFailed):
        return False
    text = str(exc)  # the OOM killer sends SIGKILL only; a worker's exit torch could not name may be it
    return "killed by SIGKILL" in text or "killed by signal: Killed" in text or "exited unexpectedly" in text


def oom_reason(reason: str) -> str:
    """A trial the kernel's OOM killer ended, in one line naming the job's memory limit."""
    return (f"killed by the kernel's out-of-memory killer inside {job_memory().describe_limit()} ({reason}); "
            "the search goes on with the other candidates")


def _death_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"the trial process was killed by {name}{hint}"
    return f"the trial process exited with status {exitcode} before reporting"


@dataclasses.dataclass(eq=False)
class _Rank:
    proc: Any
    receiver: Any
    log: str | None = None
    ready: bool = False
    result: Measurement | None = None


_LOG_TAIL = 64 << 10  # bytes of a trial's log read for a worker's death
_WORKER_DEATH = re.compile(  # torch's two messages (torch/utils/data/_utils/signal_handling.py, dataloader.py)
    r"DataLoader worker \(pid(?:\(s\))? [^)]*\) (?:is killed by signal: [^.\n]+|exited unexpectedly)")


def worker_death_in_log(path: str | None) -> str | None:
    """The reason a DataLoader worker of a trial died, from the trial's log, or None.

    torch reports a worker killed by a signal by raising from its SIGCHLD handler in the trial's main
    thread, wherever that thread is; inside a ``try/except Exception`` (torch's profiler import has one)
    the error is printed and swallowed, and the loader only notices the dead worker at its next liveness
    check, seconds later. A trial given up on or timed out meanwhile would read as slow, not as failed:
    the log still names the death."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - _LOG_TAIL))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = _WORKER_DEATH.findall(tail)
    return failure_reason(RuntimeError(found[-1])) if found else None


def shard(plan: Plan, rank: int, ranks: int) -> Plan:
    """Rank ``rank``'s share of the plan, as ``DistributedSampler(drop_last=False)`` splits a dataset: every
    ``ranks``-th index from ``rank`` on, the list padded by wrapping so every rank reads as many samples; the
    whole run it predicts covers ``ceil(length / ranks)`` samples. A cache holds every rank's samples, as
    the factory's cache holds the whole dataset, and each rank reads its shard of it (``cache_indices``)."""
    if ranks <= 1:
        return plan
    per_rank = -(-len(plan.indices) // ranks)
    padded = (list(plan.indices) * ranks)[: per_rank * ranks]  # wraps, like DistributedSampler's padding
    return dataclasses.replace(plan, indices=padded[rank::ranks], length=-(-plan.length // ranks),
                               cache_indices=list(plan.indices), cache_length=plan.length)


class TrialRunner(Protocol):
    """What the search asks of a runner (``Runner``'s real trial processes, or a test's figures by rule):
    measure ``config`` on ``plan``, or raise ``TrialFailed`` or ``TrialPruned``."""

    def run(self, config: LoaderConfig, plan: Plan, *, timeout: float,
            should_prune: Callable[[int, float], bool] | None = None, give_up_after: float | None = None,
            log_path: str | None = None) -> Measurement: ...


class Runner:
    """Starts trial processes for one workload (a ``TrialRunner``)."""

    def __init__(self, workload: Workload, sys_path: list[str] | None = None, memory_limit: int | None = None,
                 ranks: int = 1, spool: str | os.PathLike[str] | None = None):
        """``spool``: where the workload is pickled into a file for the trials, in a folder of its own named
        as trial folders are (``caches._trials``: one a search killed outright left there is removed by the
        next runner); a temporary file by default. The search holds no copy of its bytes (an in-memory
        dataset's size), and none crosses the forkserver's pipe at each trial's start."""
        self.sys_path = list(sys_path or [])
        self.memory_limit = memory_limit  # for all ranks of a trial together
        self.ranks = max(1, int(ranks))
        try:
            folder = None
            if spool is not None:
                remove_leftovers(spool)
                folder = trial_folder(spool)
            try:
                self.workload_file: str | None = _spool(workload, folder)
            except BaseException:
                if folder is not None:
                    remove_trial_folder(folder)
                raise
            weakref.finalize(self, _remove_spool, self.workload_file, folder)
            self.ctx: Any = multiprocessing.get_context("forkserver")
            self.ctx.set_forkserver_preload(_PRELOAD)
            self.fork_fallback = False
        except Exception as exc:  # noqa: BLE001 - unpicklable user objects: lambdas, notebook classes
            if "fork" not in multiprocessing.get_all_start_methods():
                raise TrialFailed(f"the dataset cannot be pickled into a trial process: {exc}") from exc
            warnings.warn(
                f"The dataset or a hook cannot be pickled ({exc}); trials run in forked processes "
                "with one main-process thread. Define them at module level to measure thread counts.",
                stacklevel=2,
            )
            global _INHERITED
            _INHERITED = workload
            self.workload_file = None
            self.ctx = multiprocessing.get_context("fork")
            self.fork_fallback = True

    def run(self, config: LoaderConfig, plan: Plan, *, timeout: float,
            should_prune: Callable[[int, float], bool] | None = None, give_up_after: float | None = None,
            log_path: str | None = None) -> Measurement:
        """Measure ``config`` in fresh processes; raise TrialFailed or TrialPruned when it does not finish.

        With ``ranks`` > 1 that many trial processes run at once on the same cores, each reading its own shard
        of the subset (``shard``), as the ranks of one torchrun job do; the figure is the slowest rank's whole
        run, and memory is the sum over all ranks. ``give_up_after``: seconds after which the trial is pruned,
        whatever it reported (a cache build that alone takes longer than the best candidate's whole subset
        run). ``log_path``: where the trial's and its workers' output goes, instead of the user's terminal.
        """
        ctx, env = self._context_for(config)
        ranks: list[_Rank] = []
        trial_dir = None
        kills = oom_kills()
        try:
            if plan.cache_root:
                # One folder for the candidate: its ranks share it, as a node's ranks share the factory's
                # cache folder, so a disk cache is built once there (under its build lock) and read by all.
                trial_dir = trial_folder(plan.cache_root)
                if self.ranks > 1:
                    ensure_root(trial_dir)  # tagged before any rank writes its lock there
            for r in range(self.ranks):
                rank_plan = shard(plan, r, self.ranks)
                if trial_dir:
                    rank_plan = dataclasses.replace(rank_plan, cache_root=trial_dir)
                rank_plan = dataclasses.replace(rank_plan, forked=ctx is self.ctx)
                rank_log = log_path if r == 0 or log_path is None else f"{os.path.splitext(log_path)[0]}.rank{r}.log"
                receiver, sender = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_trial_main,
                    args=(sender, self.workload_file, self.sys_path, config.to_json(), rank_plan, self.fork_fallback,
                          rank_log,
                          self.ranks > 1, search_start_method()),
                    name=f"autotune-trial-{r}",
                )
                ranks.append(_Rank(proc, receiver, rank_log))
                with _environment(env):
                    proc.start()
                if ctx is self.ctx and not self.fork_fallback:
                    _expendable_forkserver()  # multiprocessing restarts a dead one: that one too
                sender.close()
            if give_up_after is not None and env is not None:
                give_up_after += 5.0  # a spawned interpreter's start-up is not part of the measured figure
            result = self._watch(ranks, timeout, should_prune, give_up_after)
        except (TrialFailed, OSError, EOFError) as exc:  # a start the forkserver's death broke, too
            if ended_by_a_kill(exc) and oom_kills() > kills:
                raise TrialFailed(oom_reason(failure_reason(exc) if not isinstance(exc, TrialFailed)
                                             else str(exc))) from None
            raise
        finally:
            for rank in ranks:
                rank.receiver.close()
                if rank.proc.pid is None:
                    continue  # its start failed (a dead forkserver): that error is the one to see
                if rank.proc.is_alive():
                    kill_tree(rank.proc.pid)
                rank.proc.join(10)
            if trial_dir:
                remove_trial_folder(trial_dir)
        if self.memory_limit and result.charged_bytes > self.memory_limit:
            # The subset's run fitted, the whole run would not: its memory cache holds every sample. A recipe
            # over the budget would be OOM-killed where the budget is a job's limit.
            together = f" ({len(ranks)} ranks together)" if len(ranks) > 1 else ""
            raise TrialFailed(f"its whole run needs {format_bytes(result.charged_bytes)}{together} (a memory "
                              f"cache of every sample), over the memory budget of {format_bytes(self.memory_limit)}")
        return result

    def _watch(self, ranks: list[_Rank], timeout: float, should_prune: Callable[[int, float], bool] | None,
               give_up_after: float | None) -> Measurement:
        from multiprocessing.connection import wait

        started = time.monotonic()
        deadline = started + timeout
        next_memory_check = 0.0
        progress: dict[int, dict[int, float]] = {}  # step -> rank -> predicted total so far
        while True:
            pending = [r for r in ranks if r.result is None]
            for conn in wait([r.receiver for r in pending], timeout=0.2):
                rank = next(r for r in pending if r.receiver is conn)
                try:
                    message = rank.receiver.recv()
                except EOFError:
                    rank.proc.join(5)
                    raise TrialFailed(_death_reason(rank.proc.exitcode)) from None
                kind = message[0]
                if kind == "ready":
                    rank.ready = True
                    if all(r.ready for r in ranks):
                        started = time.monotonic()  # the give-up clock starts once every rank is ready
                        if len(ranks) > 1:
                            for r in ranks:
                                r.receiver.send("go")  # so one rank's build of a shared cache finds the others waiting
                elif kind == "result":
                    rank.result = message[1]
                elif kind == "error":
                    raise TrialFailed(message[1])
                elif kind == "progress" and should_prune is not None:
                    step, value = message[1], message[2]
                    seen = progress.setdefault(step, {})
                    seen[ranks.index(rank)] = value
                    if len(seen) == len(ranks) and should_prune(step, max(seen.values())):
                        for r in ranks:
                            with contextlib.suppress(OSError):
                                r.receiver.send("stop")  # each unwinds at its next batch; killed if it does not
                        for r in ranks:
                            r.proc.join(5)
                        raise TrialPruned(f"pruned at step {step}: predicted {max(seen.values()):.2f} s")
            if all(r.result is not None for r in ranks):
                for r in ranks:
                    r.proc.join(10)  # let it shut its workers down cleanly
                return Measurement.slowest_rank([r.result for r in ranks if r.result is not None])
            now = time.monotonic()
            if (give_up_after is not None and now - started > give_up_after) or now > deadline:
                for r in ranks:
                    died = worker_death_in_log(r.log)
                    if died:
                        raise TrialFailed(died)
            if give_up_after is not None and now - started > give_up_after:
                for r in ranks:
                    with contextlib.suppress(OSError):
                        r.receiver.send("stop")
                raise TrialPruned(f"pruned: still running after {now - started:.1f} s, more than the best "
                                  "candidate needs for its whole run on this subset")
            if now > deadline:
                logged = [r for r in ranks if r.log and r.proc.pid]  # without a log the answer would reach the terminal
                hung = what_hangs([r.proc.pid for r in logged if r.proc.pid], [r.log for r in logged])
                raise TrialTimedOut(f"timed out after {timeout:.0f} s: " + (hung or "a hung worker or a very slow "
                                                                            "candidate"))
            if self.memory_limit and now >= next_memory_check:
                next_memory_check = now + 1.0
                # RSS is cheap but counts every page shared with the forkserver and among the workers, once per
                # process: never below what the tree adds. Only when it is over the limit is the costlier
                # figure read (the one the plan and the trial's own peak count: ``machine.tree_memory``).
                used = sum(tree_rss(r.proc.pid) for r in ranks)
                if used > self.memory_limit:
                    parent = self._forked_from(ranks)
                    used = sum(tree_memory(r.proc.pid, forked_from=parent).added for r in ranks)
                if used > self.memory_limit:
                    together = f" ({len(ranks)} ranks together)" if len(ranks) > 1 else ""
                    raise TrialFailed(f"used {format_bytes(used)}{together}, over the memory budget of "
                                      f"{format_bytes(self.memory_limit)}")
            for r in ranks:
                if r.result is None and not r.proc.is_alive() and not r.receiver.poll(0):
                    raise TrialFailed(_death_reason(r.proc.exitcode))

    def _forked_from(self, ranks: list[_Rank]) -> int | None:
        """The process the ranks' trials were forked from (the forkserver, or this one in the fork fallback),
        whose pages they share; None for spawned trials, which share none of its memory."""
        try:
            parent = psutil.Process(ranks[0].proc.pid).ppid()
        except (psutil.Error, TypeError):
            return None
        if self.fork_fallback:
            return parent if parent == os.getpid() else None
        return parent if parent == forkserver_pid() else None

    def _context_for(self, config: LoaderConfig) -> tuple[Any, dict[str, str] | None]:
        """The start method for this candidate, and the environment it must start with.

        A preloaded allocator only exists in a process exec'd with it, so such candidates are spawned
        (paying an interpreter start, outside the measured figure) instead of forked from the server.
        """
        settings = config.process_settings()
        if not get_allocator(settings.allocator).preloaded:
            return self.ctx, None
        if self.workload_file is None:
            raise TrialFailed(f"{settings.allocator} needs a fresh process, and the dataset cannot be pickled")
        env, notes = launch_env(settings, os.environ)
        if notes:
            raise TrialFailed("; ".join(notes))
        return multiprocessing.get_context("spawn"), env


def _spool(workload: Workload, folder: str | None) -> str:
    """``workload`` pickled straight into a new private file under ``folder``; its path."""
    fd, path = tempfile.mkstemp(prefix="autotune-workload-", suffix=".pickle", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(workload, f, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:
        _unlink(path)
        raise
    return path


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _remove_spool(path: str, folder: str | None) -> None:
    _unlink(path)
    if folder is not None:
        remove_trial_folder(folder)


@contextlib.contextmanager
def _environment(env: dict[str, str] | None) -> Iterator[None]:
    """Temporarily make ``env`` the process environment (a spawned child inherits it at start)."""
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
