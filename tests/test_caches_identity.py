"""Never the wrong sample: a cache belongs to the dataset passed, notices a changed one, is read only
from folders only its owner can write, deletes only autotune's own folders, is never built for random
samples, and is built once however many processes ask (README "Cache identity and trust")."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from backend_plugin import registered, with_plugin
from torch.utils.data import Dataset

import autotune
from autotune import caches, cli
from autotune.caches import CacheRebuildWarning, UntrustedCache, open_or_build
from autotune.caches._codec import samples_equal
from autotune.caches._draws import RandomSamples
from autotune.caches._own import make_own
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._factory import cache_location
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._records import DatasetRecord, RunSettings

pytestmark = pytest.mark.timeout(300)

BACKENDS = with_plugin(caches.backend_names)  # the built-in ones and the test-only one (backend_plugin)
DISK = with_plugin(caches.disk_names)
_plugin = pytest.fixture(autouse=True)(registered)
DATA = Path(__file__).parent / "data"


# ------------------------------------------------------------------------------------ datasets
class Table(Dataset):
    """Rows of an array it holds: a train and a val set differ only in their data, not in attributes."""

    def __init__(self, values):
        self.values = values

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        row = self.values[i]
        return torch.from_numpy(row.copy()), int(row[0])


def table(n, start=0):
    return Table(np.arange(start, start + 3 * n, dtype=np.int64).reshape(n, 3))


class Labelled(Dataset):
    """Fixed features, labels read from ``labels.json`` on every access."""

    def __init__(self, folder):
        self.folder = str(folder)

    def __len__(self):
        return 12

    def __getitem__(self, i):
        with open(os.path.join(self.folder, "labels.json")) as fh:
            labels = json.load(fh)
        return torch.full((2,), float(i)), labels[i]


class Noisy(Dataset):
    """A random augmentation inside ``__getitem__``: no cache may freeze it."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.rand(3) + i


class Boom:
    """Unpickling it creates ``marker``: a payload that must never be decoded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


class Evil(Dataset):
    def __init__(self, marker, n):
        self.marker, self.n = str(marker), n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": Boom(self.marker)}


class Slow(Dataset):
    """Slow enough that four processes asking at once really overlap."""

    def __init__(self, seed, n=16, die_at=None):
        self.seed, self.n, self.die_at = seed, n, die_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.die_at:
            os._exit(3)
        time.sleep(0.003)
        return np.full(4, self.seed * 1000 + i, dtype=np.int64)


# ------------------------------------------------------------------------------------ helpers
@pytest.fixture(autouse=True)
def private_cache_root(tmp_path, monkeypatch):
    root = tmp_path / "user-cache"
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(root))
    return root


def write_recipe(path, backend, workers=0, context=None, source="tests/test_caches_identity.py:train"):
    config = LoaderConfig.fitted(num_workers=workers, multiprocessing_context=context if workers else None,
                                 persistent_workers=bool(workers), cache=backend)
    profile = Profile(hardware=hardware.collect(), dataset=DatasetRecord(source=source, length=12, fingerprint="x"),
                      settings=RunSettings(batch_size=4, epochs=2), config=config)
    RecipeFile.merge_write(path, profile)
    return path


def epoch(loader):
    return [(x.clone(), y) for xs, ys in loader for x, y in zip(xs, ys.tolist())]


def assert_yields(loader, dataset):
    got = epoch(loader)
    assert len(got) == len(dataset)
    for k, (x, y) in enumerate(got):
        want_x, want_y = dataset[k]
        assert torch.equal(x, want_x) and y == want_y, f"sample {k} is not this dataset's"


def snapshot(folder):
    """Every path under ``folder`` with its bytes (files) or None (folders), and its mode."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        out[str(p.relative_to(folder))] = (p.read_bytes() if p.is_file() else None, p.stat().st_mode)
    return out


def leftovers(root):
    return sorted(p.name for p in Path(root).iterdir() if p.name not in ("CACHEDIR.TAG", ".autotune-key")
                  and not p.name.endswith(".lock"))


# ------------------------------------------------------------------ (1) train and val through one recipe
CASES = [(b, w, c, n) for b in BACKENDS for w, c in ((0, None), (2, "fork")) for n in (12, 9)]
# spawn: workers reopen the cache by path. lmdb's shared environment is the case that needs it here; every
# backend's reopening under spawn is in the conformance suite (tests/test_caches.py).
CASES += [("lmdb", 2, "spawn", 9)]


@pytest.mark.parametrize("backend,workers,context,val_length", CASES)
def test_train_and_val_through_one_recipe_each_get_their_own_samples(tmp_path, backend, workers, context,
                                                                      val_length, private_cache_root):
    lengths = (12, val_length)
    recipe = write_recipe(tmp_path / "autotune.json", backend, workers, context)
    train, val = table(lengths[0]), table(lengths[1], start=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # settings from the recipe that this machine cannot apply
        warnings.simplefilter("error", CacheRebuildWarning)
        loaders = [autotune.dataloader(d, recipe, shuffle=False, progress=False) for d in (train, val)]
    for _ in range(2):
        for loader, dataset in zip(loaders, (train, val)):
            assert_yields(loader, dataset)
    if backend != "memory":
        assert len(leftovers(private_cache_root)) == 2
        # A second run reuses both (in this process: the directories are what is tested), each its own.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", CacheRebuildWarning)
            again = [autotune.dataloader(d, recipe, shuffle=False, progress=False, num_workers=0) for d in (val, train)]
        assert_yields(again[0], val)
        assert_yields(again[1], train)
        assert len(leftovers(private_cache_root)) == 2


# ------------------------------------------------------------------ (2) relabelled on disk, same length
@pytest.mark.parametrize("keep_mtime", [False, True], ids=["touched", "mtime-restored"])
@pytest.mark.parametrize("backend", DISK)
def test_two_samples_relabelled_on_disk_are_noticed(tmp_path, backend, keep_mtime):
    folder = tmp_path / "data"
    folder.mkdir()
    labels = folder / "labels.json"
    labels.write_text(json.dumps([i % 10 for i in range(12)]))
    recipe = write_recipe(tmp_path / "autotune.json", backend)
    dataset = Labelled(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_yields(autotune.dataloader(dataset, recipe, shuffle=False, progress=False), dataset)
    before = os.stat(labels)
    relabelled = [i % 10 for i in range(12)]
    relabelled[1], relabelled[5] = 7, 3
    labels.write_text(json.dumps(relabelled))  # the same number of bytes
    assert os.stat(labels).st_size == before.st_size
    if keep_mtime:
        os.utime(labels, ns=(before.st_atime_ns, before.st_mtime_ns))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = autotune.dataloader(dataset, recipe, shuffle=False, progress=False)
    (warning,) = [w for w in caught if issubclass(w.category, CacheRebuildWarning)]
    text = str(warning.message)
    assert "samples 1, 5 differ" in text
    assert ("labels.json" in text) is (not keep_mtime)
    assert [y for _, y in epoch(loader)] == relabelled


def test_a_build_whose_samples_differ_from_the_probed_ones_stores_nothing(tmp_path):
    dataset = table(12)
    manifest = caches.dataset_key(dataset)
    changed = table(12)
    changed.values[4, 1] = -1  # the data changed while the cache was being built
    root = tmp_path / "root"
    with pytest.raises(RandomSamples, match=r"dataset\[4\] read differently twice within one build"):
        open_or_build("pickle", changed, root=root, manifest=manifest, progress=False)
    assert [p.name for p in root.iterdir() if not p.name.startswith((".", "CACHEDIR"))] == []
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]
    cache = open_or_build("pickle", dataset, root=root, manifest=manifest, progress=False)
    assert cache.origin == "built" and all(samples_equal(cache[k], dataset[k]) for k in range(12))


def test_a_change_outside_the_probes_in_in_memory_data_is_noticed():
    from autotune.caches._key import probe_indices

    dataset = table(100)
    open_or_build("pickle", dataset, manifest=caches.dataset_key(dataset), progress=False)
    k = next(i for i in range(100) if i not in probe_indices(100))
    dataset.values[k, 2] = -7
    with pytest.warns(CacheRebuildWarning, match="in-memory data modified: values") as caught:
        cache = open_or_build("pickle", dataset, manifest=caches.dataset_key(dataset), progress=False)
    assert "differ" not in str(caught[0].message), "the probes did not see it; the data digest did"
    assert samples_equal(cache[k], dataset[k])


# ------------------------------------------------------------------ (3) planted caches are never decoded
def plant(victim_path, victim_expected, evil_root, marker, backend, n):
    """Build a cache whose payload creates ``marker`` and put it where the factory would look for the
    victim's, with the victim's manifest: what an attacker who can write that folder would do."""
    evil = open_or_build(backend, Evil(marker, n), root=evil_root, manifest={"key": "evil"}, progress=False)
    if marker.exists():
        marker.unlink()  # planting opened it (an hdf5 open decodes); the commands under test must not
    victim_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(evil.path, victim_path)
    stored = json.loads((victim_path / "manifest.json").read_text())
    stored["expected"] = victim_expected
    (victim_path / "manifest.json").write_text(json.dumps(stored))


def run_commands(*argv_lists):
    for argv in argv_lists:
        cli.main(argv)


@pytest.mark.parametrize("backend", DISK)
def test_a_cache_planted_in_the_working_directory_is_never_decoded(tmp_path, backend, monkeypatch, capsys):
    project = tmp_path / "cloned-project"
    planted_root = project / ".autotune" / "cache"
    marker = tmp_path / "PWNED"
    recipe = write_recipe(tmp_path / "autotune.json", backend)
    victim = table(6)
    profile = autotune.load(recipe).profile
    path = cache_location(profile, victim, planted_root)
    expected = caches.expected_manifest(caches.dataset_key(victim), range(6))
    plant(path, expected, tmp_path / "evil", marker, backend, 6)
    monkeypatch.chdir(project)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_yields(autotune.dataloader(victim, recipe, shuffle=False, progress=False), victim)
        with pytest.raises(autotune.AutotuneError, match="did not put there"):
            autotune.dataloader(victim, recipe, cache_dir=planted_root, progress=False)
    run_commands(["cache", "list"], ["cache", "list", "--dir", str(planted_root)],
                 ["cache", "clear", "--dir", str(planted_root)], ["cache", "clear"])
    capsys.readouterr()
    assert not marker.exists()


@pytest.mark.parametrize("where", ["root", "cache"])
@pytest.mark.parametrize("backend", DISK)
def test_a_group_writable_cache_is_never_decoded(tmp_path, backend, where, capsys):
    shared = tmp_path / "shared"
    marker = tmp_path / "PWNED"
    recipe = write_recipe(tmp_path / "autotune.json", backend)
    victim = table(6)
    caches.ensure_root(shared)  # a real, tagged cache root...
    path = cache_location(autotune.load(recipe).profile, victim, shared)
    plant(path, caches.expected_manifest(caches.dataset_key(victim), range(6)), tmp_path / "evil", marker,
          backend, 6)
    os.chmod(shared if where == "root" else path, 0o775)  # ...that its group can write
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UntrustedCache) as err:
            autotune.dataloader(victim, recipe, cache_dir=shared, progress=False)
    message = str(err.value)
    assert "\n" not in message and "writable by its group" in message and "chmod go-w" in message
    with pytest.raises(UntrustedCache):
        caches.get_backend(backend).open(path, manifest=json.loads((path / "manifest.json").read_text())["expected"])
    run_commands(["cache", "list", "--dir", str(shared)], ["cache", "clear", "--dir", str(shared)])
    capsys.readouterr()
    assert not marker.exists()


def test_a_symlinked_cache_directory_is_not_read(tmp_path):
    dataset = table(6)
    built = open_or_build("pickle", dataset, root=tmp_path / "a", manifest=caches.dataset_key(dataset), progress=False)
    link = tmp_path / "link"
    link.symlink_to(built.path)
    with pytest.raises(UntrustedCache, match="symbolic link"):
        caches.PickleCache.open(link, manifest=built.manifest["expected"])


def test_the_default_root_is_per_user_and_private(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOTUNE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert caches.default_root() == tmp_path / "xdg" / "autotune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert caches.default_root() == tmp_path / "home" / ".cache" / "autotune"
    root = caches.ensure_root()
    assert (root.stat().st_mode & 0o777) == 0o700 and (root / "CACHEDIR.TAG").is_file()



def test_a_new_root_another_process_is_tagging_is_not_taken_for_foreign_files(tmp_path):
    # The window four processes opening one new root hit: one has written its tag's temporary file and
    # not yet renamed it; the others must not call the folder somebody's data.
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    (root / ".CACHEDIR.TAG.tmp-4242-0a1b2c3d").write_text("Signature: 8a47")
    assert caches.ensure_root(root) == root and (root / "CACHEDIR.TAG").is_file()
    (root / "notes.txt").write_text("mine")
    os.remove(root / "CACHEDIR.TAG")
    with pytest.raises(autotune.AutotuneError, match="did not put there"):
        caches.ensure_root(root)

# ------------------------------------------------------------------ (4) a recipe aiming at a user's folder
@pytest.mark.parametrize("backend", DISK)
def test_a_recipe_aiming_at_a_users_folder_leaves_it_byte_identical(tmp_path, backend):
    users = tmp_path / "datasets"
    (users / f"{backend}-train").mkdir(parents=True)
    (users / f"{backend}-train" / "data.mdb").write_bytes(b"the user's own database")
    (users / "train").mkdir()
    (users / "train" / "0.txt").write_text("a sample")
    before = snapshot(users)
    doc = json.loads((DATA / "recipe_v1.json").read_text())
    for profile in doc["profiles"].values():  # version 1 could name a cache root: it is ignored now
        profile["cache"] = {"backend": backend, "root": str(users)}
        profile["dataset"]["source"] = "train"
        profile["loader"]["num_workers"] = 0
    recipe = tmp_path / "autotune.json"
    recipe.write_text(json.dumps(doc))
    dataset = table(6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_yields(autotune.dataloader(dataset, recipe, shuffle=False, batch_size=4, progress=False), dataset)
        with pytest.raises(autotune.AutotuneError, match="did not put there"):
            autotune.dataloader(dataset, recipe, cache_dir=users, progress=False)
    assert snapshot(users) == before


# ------------------------------------------------------------------ (5) clear never touches foreign folders
def test_cache_clear_leaves_folders_without_a_manifest_alone(tmp_path, capsys):
    data = tmp_path / "data"
    for name in ("lmdb-imagenet", "pickle-raw"):
        (data / name).mkdir(parents=True)
        (data / name / "data.mdb").write_bytes(os.urandom(64))
    (data / ".pickle-raw.tmp-backup").mkdir()  # close to, but not, autotune's temp names
    before = snapshot(data)
    assert cli.main(["cache", "list", "--dir", str(data)]) == 0
    listed = capsys.readouterr().out
    assert listed.count("foreign") >= 3
    assert cli.main(["cache", "clear", "--dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert "Removed 0 caches" in out
    assert f"Left {data / 'lmdb-imagenet'} untouched: not autotune's." in out
    assert f"Left {data / 'pickle-raw'} untouched: not autotune's." in out
    assert snapshot(data) == before


def test_cache_clear_removes_trial_leftovers_but_not_a_running_trial(tmp_path, capsys):
    from autotune.caches._lock import BuildLock
    from autotune.tuner._measure import _hold_trial_folder

    trials = tmp_path / ".autotune" / "cache" / "trials"
    trials.mkdir(parents=True, mode=0o777)
    os.chmod(trials, 0o777)
    dead, alive = trials / "trial-aaaaaaaa", trials / "trial-bbbbbbbb"
    for folder in (dead, alive):
        make_own(folder, "trial")  # as caches._trials.trial_folder marks it
        _hold_trial_folder(str(folder))
        caches.PickleCache.build(table(4), range(4), folder / "pickle", manifest={"trial": True}, progress=False)
    assert (trials.stat().st_mode & 0o022) == 0, "autotune tightened its own trials folder"
    from autotune.tuner import _measure

    _measure._held.pop(str(dead)).release()  # the dead trial's process is gone
    assert isinstance(_measure._held[str(alive)], BuildLock)
    assert cli.main(["cache", "clear", "--workdir", str(tmp_path / ".autotune")]) == 0
    out = capsys.readouterr().out
    assert f"Left {alive} untouched: in use" in out
    assert not dead.exists() and alive.exists()
    _measure._held.pop(str(alive)).release()


def test_a_trial_folder_others_can_write_is_refused(tmp_path):
    from autotune.tuner._measure import _hold_trial_folder

    folder = tmp_path / "trial-cccccccc"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with pytest.raises(UntrustedCache, match="writable by group and others"):
        _hold_trial_folder(str(folder))


# ------------------------------------------------------------------ (6) random samples are never cached
@pytest.mark.parametrize("backend,workers", [("memory", 0), ("memory", 2), ("pickle", 0)])
def test_a_random_dataset_gets_no_cache_and_one_warning(tmp_path, backend, workers, private_cache_root):
    recipe = write_recipe(tmp_path / "autotune.json", None, workers, "fork" if workers else None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = autotune.dataloader(Noisy(), recipe, cache=backend, shuffle=False, progress=False)
    mine = [w for w in caught if "transform=" in str(w.message)]
    assert len(mine) == 1 and "dataset[0] drew from torch's random generator" in str(mine[0].message)
    assert loader.autotune.settings["cache"] is None
    first, second = torch.cat([b for b in loader]), torch.cat([b for b in loader])
    assert not torch.equal(first, second)
    assert not private_cache_root.exists() or leftovers(private_cache_root) == []


# ------------------------------------------------------------------ (7) one build, however many ask
def _open_at_once(backend, root, seed, barrier, results):
    dataset = Slow(seed)
    barrier.wait()
    try:
        cache = open_or_build(backend, dataset, root=root, manifest=caches.dataset_key(dataset), progress=False)
    except Exception as exc:  # reported at once rather than as a queue timeout
        results.put(("error", repr(exc), "", ""))
        return
    digest = hashlib.sha256(b"".join(np.asarray(cache[k]).tobytes() for k in range(len(cache)))).hexdigest()
    results.put((cache.origin, cache.manifest["builder"]["id"], digest, str(cache.path)))


@pytest.mark.parametrize("backend", DISK)
def test_four_processes_opening_one_new_cache_build_it_once(tmp_path, backend):
    ctx = multiprocessing.get_context("fork")
    root = tmp_path / "root"
    for rep in range(10):
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_open_at_once, args=(backend, root, rep, barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        got = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        assert [g for g in got if g[0] == "error"] == []
        origins = sorted(g[0] for g in got)
        assert origins.count("built") == 1, origins
        assert len({g[1] for g in got}) == 1, "every process reads the one build"
        want = hashlib.sha256(b"".join(Slow(rep)[k].tobytes() for k in range(16))).hexdigest()
        assert {g[2] for g in got} == {want}
        assert len({g[3] for g in got}) == 1
    assert len(leftovers(root)) == 10, "one directory per cache, no temp directory left"


def _build_and_die(root):
    dataset = Slow(7, die_at=10)
    open_or_build("pickle", dataset, root=root, manifest=caches.dataset_key(Slow(7)), progress=False)


def test_a_dead_builder_releases_the_lock_and_the_next_builds(tmp_path):
    from autotune.caches._lock import is_free, lock_path

    root = tmp_path / "root"
    manifest = caches.dataset_key(Slow(7))
    name = caches.cache_path("pickle", root, caches.expected_manifest(manifest, range(16))).name
    proc = multiprocessing.get_context("fork").Process(target=_build_and_die, args=(root,))
    proc.start()
    deadline = time.monotonic() + 60
    while is_free(lock_path(root, name)) and proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    cache = open_or_build("pickle", Slow(7), root=root, manifest=manifest, progress=False)  # waits, then builds
    proc.join(60)
    assert proc.exitcode == 3
    assert cache.origin == "built"
    assert leftovers(root) == [name]
    assert all(samples_equal(cache[k], Slow(7)[k]) for k in range(16))


def test_a_waiting_process_says_whom_it_waits_for(tmp_path, capfd):
    import socket
    import threading

    from autotune.caches._lock import BuildLock, lock_path

    root = tmp_path / "root"
    dataset = Slow(3)
    manifest = caches.dataset_key(dataset)
    name = caches.cache_path("pickle", caches.ensure_root(root), caches.expected_manifest(manifest, range(16))).name
    held = BuildLock(lock_path(root, name))
    assert held.try_acquire()
    assert BuildLock(lock_path(root, name)).holder() == f"pid {os.getpid()} on {socket.gethostname()}"
    opened = []
    waiter = threading.Thread(target=lambda: opened.append(
        open_or_build("pickle", dataset, root=root, manifest=manifest, progress=True)))
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive(), "it waits while the lock is held"
    held.release()
    waiter.join(60)
    assert opened[0].origin == "built"
    assert f"Waiting for pid {os.getpid()} on {socket.gethostname()} to build the pickle cache" in capfd.readouterr().err
