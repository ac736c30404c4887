"""One conformance suite for every cache backend: exact samples, under real DataLoader workers
(fork and spawn), atomic builds, stale/corrupt detection and rebuild, transforms, and the CLI."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from backend_plugin import registered, with_plugin
from test_codec import ZooDataset

from autotune import caches, cli
from autotune.caches import (
    CacheRebuildWarning,
    CorruptCache,
    StaleCache,
    get_backend,
    open_or_build,
)
from autotune.caches._codec import samples_equal
from autotune.errors import AutotuneError
from autotune.loader import Transformed

BACKENDS = with_plugin(caches.backend_names)  # the built-in ones and the test-only one (backend_plugin)
DISK = with_plugin(caches.disk_names)
DATA_FILE = {"pickle": "data.bin", "hdf5": "data.h5", "lmdb": "db/data.mdb", "shelf": "records/0.bin"}
_plugin = pytest.fixture(autouse=True)(registered)


def identity(x):
    return x


def with_pid(sample):
    return os.getpid(), sample


def add_noise(sample):
    """A random augmentation: belongs in `transform`, after the cache."""
    return sample + torch.rand(sample.shape)


class Tensors(torch.utils.data.Dataset):
    def __init__(self, n=12):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.arange(6, dtype=torch.float32).reshape(2, 3) + i


class Strided(torch.utils.data.Dataset):
    """Samples that are views, not C-order arrays: an image decoded HWC and returned CHW, a transposed
    array, a broadcast tensor (stride 0), every other element, a permuted bfloat16."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        hwc = torch.arange(4 * 5 * 3, dtype=torch.uint8).reshape(4, 5, 3) + i
        return {
            "chw": hwc.permute(2, 0, 1).float().div_(255),
            "t": np.arange(12, dtype=np.float64).reshape(3, 4).T + i,
            "wide": torch.tensor([float(i)]).expand(3, 4),
            "step": torch.arange(20, dtype=torch.int64)[::2] * i,
            "bf16": (torch.arange(6, dtype=torch.float32).reshape(2, 3) + i).to(torch.bfloat16).T,
        }


class FailsAt(torch.utils.data.Dataset):
    """Raises at ``bad`` (or kills its process when ``kill``): an interrupted build."""

    def __init__(self, bad=5, kill=False):
        self.bad, self.kill = bad, kill

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == self.bad:
            if self.kill:
                os._exit(3)
            raise RuntimeError(f"decode failed at {i}")
        return np.full(4, i, dtype=np.int32)


def build(backend, dataset, tmp_path, fingerprint="fp", **kw):
    return open_or_build(backend, dataset, root=tmp_path, manifest={"fingerprint": fingerprint, **kw},
                         progress=False)


def assert_exact(cache, dataset, indices=None):
    indices = range(len(dataset)) if indices is None else indices
    assert len(cache) == len(indices)
    for k, i in enumerate(indices):
        assert samples_equal(cache[k], dataset[i]), f"position {k} (dataset[{i}]) differs"


# --------------------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["zoo", "var"])
def test_roundtrip_direct(backend, kind, tmp_path):
    ds = ZooDataset(7, kind)
    cache = build(backend, ds, tmp_path)
    assert isinstance(cache, get_backend(backend))
    assert_exact(cache, ds)
    assert cache.nbytes > 0
    with pytest.raises(IndexError):
        cache[len(ds)]
    if backend != "memory":  # reopened from disk it is still exact
        assert_exact(get_backend(backend).open(cache.path, manifest=cache.manifest["expected"], verify=True), ds)


@pytest.mark.parametrize("backend", BACKENDS)
def test_subset_of_indices(backend, tmp_path):
    ds = ZooDataset(9)
    idx = [8, 2, 5]
    cache = open_or_build(backend, ds, root=tmp_path, manifest={"fingerprint": "f"}, indices=idx, progress=False)
    assert_exact(cache, ds, idx)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
# Spawn once per backend, with two workers: each spawned worker unpickles and reopens the cache (what spawn
# adds), and two of them also split the samples, which the fork cells check with one and two workers.
@pytest.mark.parametrize("workers, context", [(0, None), (1, "fork"), (2, "fork"), (2, "spawn")])
def test_roundtrip_through_dataloader_workers(backend, workers, context, tmp_path):
    ds = ZooDataset(6, big_endian=False)
    cache = build(backend, ds, tmp_path)
    loader = torch.utils.data.DataLoader(
        Transformed(cache, transform=with_pid), batch_size=None, num_workers=workers,
        multiprocessing_context=context, collate_fn=identity,
    )
    pids = set()
    for i, (pid, sample) in enumerate(loader):
        pids.add(pid)
        assert samples_equal(sample, ds[i]), f"sample {i} differs"
    assert i == len(ds) - 1
    if workers:
        assert os.getpid() not in pids and len(pids) == workers  # every worker read (and opened) its own
        if backend != "memory":
            assert not cache.is_open  # the parent never opened a handle


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_overflow_samples_through_forked_workers(backend, tmp_path):
    ds = ZooDataset(8, "var")
    cache = build(backend, ds, tmp_path)
    loader = torch.utils.data.DataLoader(Transformed(cache), batch_size=None, num_workers=2, collate_fn=identity)
    got = list(loader)
    assert all(samples_equal(got[i], ds[i]) for i in range(len(ds)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_parallel_build_is_exact(backend, tmp_path):
    ds = ZooDataset(10)
    cache = open_or_build(backend, ds, root=tmp_path, manifest={"fingerprint": "p"}, workers=2, progress=True)
    assert_exact(cache, ds)


_BUILDER = [0]  # set at run time by the building process: a forked worker inherits it, a fresh interpreter does not


class BuildersMark(torch.utils.data.Dataset):
    """Each sample is the building process's mark as the process that read it sees it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([_BUILDER[0], i])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", caches.disk_names())
def test_a_builds_workers_start_as_the_process_starts_them_and_the_plan_counts_them_so(backend, tmp_path):
    """A disk build's read workers take the process's start method: the user's, never overridden (a user who
    chose spawn gets spawned build workers, fresh interpreters that do not see this process's state), and
    in a trial its search's (tuner/_runner.py). The memory plan counts them by that method."""
    from autotune.config import LoaderConfig
    from autotune.tuner._memory_plan import TrialMemory

    before = multiprocessing.get_start_method(allow_none=True)
    _BUILDER[0] = os.getpid()
    try:
        for method, seen in (("fork", os.getpid()), ("spawn", 0)):
            multiprocessing.set_start_method(method, force=True)
            cache = caches.get_backend(backend).build(BuildersMark(), range(4), tmp_path / method, manifest={},
                                                      progress=False, workers=2)
            assert [cache[k].tolist() for k in range(4)] == [[seen, k] for k in range(4)]
    finally:
        _BUILDER[0] = 0
        multiprocessing.set_start_method(before, force=True)
    plan = {m: TrialMemory(budget=1 << 40, interpreter=100, heap=10, dataset=5, batch_bytes=1, sample_bytes=1,
                           build_workers=2, build_context=m) for m in ("fork", "spawn", "forkserver")}
    config = LoaderConfig(cache=backend)
    chunk = caches.READ_CHUNK
    main = 10 + 5 + caches.get_backend(backend).build_held(1, None)  # and what its writer holds beside the chunks
    assert plan["fork"]._build(config) == main + 2 * chunk + 2 * (10 + 3 * chunk)
    assert plan["spawn"]._build(config) == main + 2 * chunk + 2 * (10 + 3 * chunk + 100 + 5)
    assert plan["forkserver"]._build(config) == plan["spawn"]._build(config) + 100  # and its server


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workers", [0, 2])
def test_strided_samples_are_stored_in_their_values_order(backend, workers, tmp_path):
    ds = Strided()
    assert not ds[1]["chw"].is_contiguous() and not ds[1]["t"].flags.c_contiguous  # the case under test
    cache = open_or_build(backend, ds, root=tmp_path, manifest={"fingerprint": "s"}, workers=workers, progress=False)
    assert_exact(cache, ds)
    loaded = list(torch.utils.data.DataLoader(Transformed(cache), batch_size=None, num_workers=workers,
                                              collate_fn=identity))
    assert all(samples_equal(loaded[i], ds[i]) for i in range(len(ds)))


def test_memory_cache_is_a_few_contiguous_buffers():
    ds = ZooDataset(5)
    cache = open_or_build("memory", ds, root=None, manifest={}, progress=False)
    assert len(cache.columns) == len(cache.schema.columns)
    for col, leaf in zip(cache.columns, cache.schema.columns):
        assert col.shape == (5, *leaf.shape) and col.flags.c_contiguous
    assert cache.blobs.dtype == np.uint8 and cache.offsets.shape == (6,)


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memory files need memfd_create")
def test_a_memory_cache_built_in_workers_is_written_through_memory_files_and_leaks_no_descriptor():
    """The build's workers write each column through a memory file's descriptor (``_FileColumn``): the
    columns are those files' shared mappings. The build's own descriptors are closed when it ends; what
    stays open is each mapping's (Python's mmap keeps one), until the cache is freed."""
    import gc

    def memory_files() -> list[str]:
        found = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                found.append(os.readlink(f"/proc/self/fd/{fd}"))
        return [f for f in found if "memfd:autotune-memory-cache" in f]

    ds = Strided()
    before = len(memory_files())
    cache = open_or_build("memory", ds, root=None, manifest={}, progress=False, workers=2)
    assert len(memory_files()) - before == len(cache.columns)  # one per mapping, none left by the build
    assert Path("/proc/self/maps").read_text().count("/memfd:autotune-memory-cache") >= len(cache.columns)
    assert all(samples_equal(cache[i], ds[i]) for i in range(len(ds)))
    assert [c.flags.c_contiguous for c in cache.columns] == [True] * len(cache.columns)
    del cache
    gc.collect()
    assert len(memory_files()) == before


@pytest.mark.parametrize("backend", DISK)
def test_no_handle_in_parent_and_small_pickle(backend, tmp_path):
    ds = Tensors(200)
    cache = build(backend, ds, tmp_path)
    assert not cache.is_open
    small = len(pickle.dumps(cache))
    assert small < 20_000, "the pickled cache must carry no data and no handle"
    cache[3]
    assert cache.is_open
    clone = pickle.loads(pickle.dumps(cache))
    assert not clone.is_open and len(pickle.dumps(cache)) == small
    assert samples_equal(clone[7], ds[7])
    cache.close()
    assert not cache.is_open


# --------------------------------------------------------------------------------------------- lifecycle
@pytest.mark.parametrize("backend", DISK)
def test_valid_cache_is_reused(backend, tmp_path):
    ds = Tensors()
    first = build(backend, ds, tmp_path)
    data = first.path / DATA_FILE[backend]
    mtime = data.stat().st_mtime_ns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = build(backend, ds, tmp_path)
    assert again.path == first.path and data.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("backend", DISK)
@pytest.mark.parametrize("damage", ["manifest", "truncate", "garble", "delete"])
def test_corrupt_cache_is_detected_and_rebuilt(backend, damage, tmp_path):
    ds = Tensors()
    cache = build(backend, ds, tmp_path)
    path, expected = cache.path, cache.manifest["expected"]
    del cache  # nothing reads it any more: the rebuild may replace it (a leased one it builds beside)
    data = path / DATA_FILE[backend]
    if damage == "manifest":
        text = (path / "manifest.json").read_text()
        (path / "manifest.json").write_text(text[: len(text) // 2])
    elif damage == "truncate":
        os.truncate(data, data.stat().st_size // 2)
    elif damage == "garble":
        raw = np.fromfile(data, dtype=np.uint8)
        (raw ^ 0x5A).tofile(data)
    else:
        data.unlink()
    with pytest.raises(CorruptCache):
        get_backend(backend).open(path, manifest=expected)
    with pytest.warns(CacheRebuildWarning, match="anew"):
        rebuilt = build(backend, ds, tmp_path)
    assert rebuilt.path == path
    assert_exact(rebuilt, ds)
    assert [e["status"] for e in caches.list_caches(tmp_path)] == ["valid"]


@pytest.mark.parametrize("backend", ["pickle", "lmdb"])
def test_one_garbled_record_fails_its_checksum(backend, tmp_path):
    ds = Tensors(50)
    cache = build(backend, ds, tmp_path)
    data = cache.path / DATA_FILE[backend]
    raw = bytearray(data.read_bytes())
    needle = ds[17].numpy().tobytes()
    at = raw.find(needle)
    assert at > 0
    raw[at + 5] ^= 0xFF  # one bit pattern inside sample 17's values
    data.write_bytes(bytes(raw))
    cls = get_backend(backend)
    reopened = cls.open(cache.path, manifest=cache.manifest["expected"])  # the quick probe misses it
    with pytest.raises(CorruptCache, match="checksum"):
        reopened[17]
    with pytest.raises(CorruptCache):
        cls.open(cache.path, manifest=cache.manifest["expected"], verify=True)


@pytest.mark.parametrize("backend", DISK)
def test_a_changed_dataset_gets_a_new_directory(backend, tmp_path):
    old = build(backend, Tensors(12), tmp_path, fingerprint="old", key="my_dataset")
    with pytest.raises(StaleCache, match="fingerprint"):
        get_backend(backend).open(old.path, manifest={**old.manifest["expected"], "fingerprint": "new"})
    ds = Tensors(15)
    with pytest.warns(CacheRebuildWarning, match="changed.*fingerprint: 'old' -> 'new'.*cache clear"):
        new = build(backend, ds, tmp_path, fingerprint="new", key="my_dataset")
    assert new.path != old.path and old.path.is_dir(), "the old directory is never replaced"
    assert_exact(new, ds)
    assert_exact(old, Tensors(12))
    entries = {e["path"]: e for e in caches.list_caches(tmp_path)}
    assert entries[str(new.path)]["samples"] == 15 and entries[str(new.path)]["status"] == "valid"


def leftovers(root):
    """What is in a cache root besides its tag, signing key and lock files (which stay: NOTE [cache build lock])."""
    return sorted(p.name for p in root.iterdir() if p.name not in ("CACHEDIR.TAG", ".autotune-key")
                  and not p.name.endswith(".lock"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workers", [0, 2])
def test_interrupted_build_leaves_nothing(backend, workers, tmp_path):
    with pytest.raises(RuntimeError, match="decode failed"):
        open_or_build(backend, FailsAt(), root=tmp_path, manifest={"fingerprint": "x"}, progress=False,
                      workers=workers)
    assert leftovers(tmp_path) == []
    assert caches.list_caches(tmp_path) == []


def _build_then_die(root):
    open_or_build("pickle", FailsAt(kill=True), root=root, manifest={"fingerprint": "x"}, progress=False)


@pytest.mark.timeout(120)
def test_killed_build_litter_is_never_read(tmp_path):
    proc = multiprocessing.get_context("fork").Process(target=_build_then_die, args=(tmp_path,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 3
    (litter,) = [tmp_path / n for n in leftovers(tmp_path)]
    assert litter.name.startswith(".pickle-x-") and ".tmp-" in litter.name
    with pytest.raises(CorruptCache, match="interrupted"):
        get_backend("pickle").open(litter, manifest={"fingerprint": "x"})
    (entry,) = caches.list_caches(tmp_path)
    assert entry["status"] == "partial"
    good = FailsAt(bad=-1)
    assert_exact(open_or_build("pickle", good, root=tmp_path, manifest={"fingerprint": "x"}, progress=False), good)
    assert leftovers(tmp_path) != [litter.name], "the next builder removed the dead one's temp directory"
    assert len(caches.clear_caches(tmp_path)["removed"]) == 1 and leftovers(tmp_path) == []


# --------------------------------------------------------------------------------------------- transform
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_transform_stays_random_per_epoch(backend, tmp_path):
    ds = Tensors()
    cache = build(backend, ds, tmp_path)
    assert_exact(cache, ds)  # before the transform: exactly the dataset
    loader = torch.utils.data.DataLoader(Transformed(cache, add_noise), batch_size=4, num_workers=1)
    epoch1 = torch.cat(list(loader))
    epoch2 = torch.cat(list(loader))
    assert not torch.equal(epoch1, epoch2)
    base = torch.stack([ds[i] for i in range(len(ds))])
    assert bool(((epoch1 - base) >= 0).all() and ((epoch1 - base) < 1).all())


# --------------------------------------------------------------------------------------------- registry
def test_get_backend_unknown_names_the_valid_ones():
    assert get_backend("lmdb") is caches.LmdbCache
    with pytest.raises(AutotuneError) as err:
        get_backend("x")
    assert str(err.value) == "Unknown cache backend 'x'. Valid backends: memory, pickle, hdf5, lmdb, shelf."


def test_a_backend_registered_by_a_plugin_is_listed_estimated_offered_and_cleared(tmp_path, capsys):
    """The test-only backend (``backend_plugin``) is one ``register`` call: every list, pattern and
    decision takes it in, and it leaves with ``unregister``."""
    from backend_plugin import ShelfCache

    from autotune.caches._own import make_own
    from autotune.config import LoaderConfig
    from autotune.tuner._options import parse_caches

    assert get_backend("shelf") is ShelfCache and "shelf" in caches.disk_names()
    assert caches.estimate_need("shelf", 1000, 10) == ShelfCache.estimate_need(1000, 10) == (0, 50960 + (1 << 20))
    assert parse_caches("shelf,none") == ("shelf", "none")
    assert LoaderConfig(cache="shelf").describe_cache(ranks=2) == "shelf cache, shared by the node's 2 ranks"
    shelf = build("shelf", Tensors(), tmp_path)
    litter = make_own(tmp_path / f".{shelf.path.name}.tmp-999999-abcd1234", "build")  # a dead builder's
    (litter / "records").mkdir()
    entries = {Path(e["path"]).name: (e["kind"], e["backend"], e["status"]) for e in caches.list_caches(tmp_path)}
    assert entries == {shelf.path.name: ("cache", "shelf", "valid"), litter.name: ("temp", "shelf", "partial")}
    del shelf  # read no more: its lease goes with it
    assert cli.main(["cache", "clear", "--dir", str(tmp_path), "--backend", "shelf"]) == 0
    assert "Removed 2 caches " in capsys.readouterr().out
    assert leftovers(tmp_path) == []
    caches.unregister("shelf")
    with pytest.raises(AutotuneError, match="Valid backends: memory, pickle, hdf5, lmdb."):
        get_backend("shelf")


def test_estimate_need():
    mb = 1 << 20
    ram, disk = caches.estimate_need("memory", 600_000, 1000)
    assert ram >= 600 * 1000 * 1000 and disk == 0
    for b in DISK:
        ram, disk = caches.estimate_need(b, 600_000, 1000)
        assert ram == 0 and 600_000 * 1000 <= disk < 1.5 * 600_000 * 1000 + 8 * mb
    with pytest.raises(AutotuneError):
        caches.estimate_need("zip", 1, 1)


def test_memory_cache_cannot_be_opened_from_a_path():
    with pytest.raises(ValueError, match="build"):
        caches.MemoryCache.open("x", manifest={})


# --------------------------------------------------------------------------------------------- CLI
def test_cli_cache_list_and_clear(tmp_path, capsys):
    paths = {b: build(b, Tensors(), tmp_path, fingerprint="abcd1234").path for b in ("pickle", "lmdb", "hdf5")}
    (tmp_path / "unrelated").mkdir()
    (paths["hdf5"] / "manifest.json").write_text("{")  # no longer an autotune manifest: not ours to delete
    assert cli.main(["cache", "list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["BACKEND", "PATH", "SAMPLES", "SIZE", "DATASET", "BUILT", "STATE"]
    rows = {line.split()[1]: line for line in out[1:5]}
    assert set(rows) == {str(p) for p in paths.values()} | {str(tmp_path / "unrelated")}
    assert "abcd1234" in rows[str(paths["pickle"])] and rows[str(paths["pickle"])].endswith("valid")
    assert " 12 " in rows[str(paths["pickle"])]
    assert rows[str(paths["hdf5"])].endswith("foreign") and rows[str(tmp_path / "unrelated")].endswith("foreign")
    assert cli.main(["cache", "clear", "--dir", str(tmp_path), "--backend", "pickle"]) == 0
    assert "Removed 1 cache " in capsys.readouterr().out
    assert sorted(e["backend"] for e in caches.list_caches(tmp_path) if e["status"] == "valid") == ["lmdb"]
    assert cli.main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Removed 1 cache " in out and f"Left {paths['hdf5']} untouched: not autotune's." in out
    assert leftovers(tmp_path) == sorted([paths["hdf5"].name, "unrelated"])
