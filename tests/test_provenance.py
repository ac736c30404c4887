"""A disk cache is checked against everything its samples were made from (issue: provenance, not probes).

Each dataset pattern users write is built (0 and 2 workers) and filled by a first epoch (2 workers) for
every disk backend; then its data is edited as a user would, outside the 16 probed indices, and the next
run must serve exactly the live ``dataset[i]`` (a rebuild, with a warning saying why), never the old one.
"""

from __future__ import annotations

import csv
import json
import os
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from autotune import caches
from autotune.caches import CacheRebuildWarning, open_or_build
from autotune.caches._codec import samples_equal
from autotune.caches._key import probe_indices
from autotune.caches._provenance import Sources, changed, read
from autotune.caches._registry import open_or_fill

N = 24  # more than the 16 probed indices, so an edit can fall outside them
EDITED = [i for i in range(N) if i not in probe_indices(N)][:2]
DISK = ("pickle", "hdf5", "lmdb")


def write_arrays(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(N):
        np.save(root / f"{i:05d}.npy", np.full(16, float(i), dtype=np.float32))


def edit_file(path: Path, value: float) -> None:
    """An ordinary edit: the same size, new bytes, a later mtime (after a tick of the file clock)."""
    time.sleep(0.02)
    np.save(path, np.full(16, value, dtype=np.float32))


# ------------------------------------------------------------------------------------ the patterns
class PathList(Dataset):
    """Full paths in a list, labels in a parallel list."""

    def __init__(self, root):
        self.paths = [str(Path(root) / f"{i:05d}.npy") for i in range(N)]
        self.labels = list(range(N))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return torch.from_numpy(np.load(self.paths[i])), self.labels[i]


class Basenames(Dataset):
    """The article's DiskImageDataset: ``sorted(os.listdir(root))``, joined to the root in ``__getitem__``."""

    def __init__(self, root):
        self.root = str(root)
        self.names = sorted(n for n in os.listdir(root) if n.endswith(".npy"))  # the files, not meta/

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        return torch.from_numpy(np.load(os.path.join(self.root, self.names[i]))), i


class Computed(Dataset):
    """Paths computed from the index: nothing in the dataset lists them."""

    def __init__(self, root):
        self.root = str(root)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.from_numpy(np.load(f"{self.root}/{i:05d}.npy")), i


class JsonLabels(Computed):
    """Labels read into a dict in ``__init__`` (the file is opened before any read)."""

    def __init__(self, root):
        super().__init__(root)
        with open(Path(root) / "meta" / "labels.json") as fh:
            self.labels = json.load(fh)

    def __getitem__(self, i):
        return super().__getitem__(i)[0], self.labels[f"{i:05d}"]


class CsvLabels(Computed):
    """Labels in a CSV, read into a pandas frame."""

    def __init__(self, root):
        super().__init__(root)
        self.frame = pd.read_csv(Path(root) / "meta" / "labels.csv")

    def __getitem__(self, i):
        return super().__getitem__(i)[0], int(self.frame["label"].iloc[i])


class CsvRows(Computed):
    """Labels in a CSV, read with the csv module into a list of rows."""

    def __init__(self, root):
        super().__init__(root)
        with open(Path(root) / "meta" / "labels.csv", newline="") as fh:
            self.rows = list(csv.reader(fh))[1:]

    def __getitem__(self, i):
        return super().__getitem__(i)[0], int(self.rows[i][1])


class Hdf5Native(Dataset):
    """One HDF5 file opened lazily by native code in each process (no Python ``open`` to see)."""

    def __init__(self, root):
        self.path = str(Path(root) / "meta" / "data.h5")
        self._file = None
        self._pid = None

    def __len__(self):
        return N

    def __getitem__(self, i):
        if self._file is None or self._pid != os.getpid():
            self._file, self._pid = h5py.File(self.path, "r"), os.getpid()
        return torch.from_numpy(self._file["x"][i]), i

    def __getstate__(self):
        return {**self.__dict__, "_file": None, "_pid": None}


class Hdf5PerRead(Dataset):
    """The HDF5 file opened and closed by native code inside every read (``with h5py.File(self.path)``): no
    open through Python, no file held open between reads."""

    def __init__(self, root):
        self.path = str(Path(root) / "meta" / "data.h5")

    def __len__(self):
        return N

    def __getitem__(self, i):
        with h5py.File(self.path, "r") as f:
            return torch.from_numpy(f["x"][i]), i


class Hdf5PerIndex(Dataset):
    """One HDF5 file per sample, its name computed from the index under a root and opened by h5py's C code
    inside each read: no Python open, no descriptor left after the read, no attribute naming the file."""

    def __init__(self, root):
        self.root = str(Path(root) / "h5")
        self.index = str(Path(root) / "h5" / "00000.h5")  # a file named inside the folder is no visible read

    def __len__(self):
        return N

    def __getitem__(self, i):
        with h5py.File(f"{self.root}/{i:05d}.h5", "r") as f:
            return torch.from_numpy(f["x"][:]), i


class Memmapped(Dataset):
    """One array memory-mapped in ``__init__`` (numpy closes the descriptor: only the mapping is left)."""

    def __init__(self, root):
        self.array = np.load(Path(root) / "meta" / "all.npy", mmap_mode="r")

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.array[i])), i


class ThreadPooled(Computed):
    """Each sample's file read on a thread of a pool (multi-file samples, a library reading on its IO thread):
    the open happens in a thread the read started, not in the reading thread."""

    def __getitem__(self, i):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(Computed.__getitem__, self, i).result()


def _labels(root: Path, change: dict[int, int] | None = None) -> None:
    labels = {f"{i:05d}": i % 5 for i in range(N)}
    for i, v in (change or {}).items():
        labels[f"{i:05d}"] = v
    (root / "meta" / "labels.json").write_text(json.dumps(labels))
    with open(root / "meta" / "labels.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["name", "label"])
        w.writerows([name, v] for name, v in labels.items())


def _stacked(root: Path) -> None:
    data = np.stack([np.load(root / f"{i:05d}.npy") for i in range(N)])
    with h5py.File(root / "meta" / "data.h5", "w") as f:
        f["x"] = data
    np.save(root / "meta" / "all.npy", data)


def _per_index_h5(root: Path) -> None:
    (root / "h5").mkdir()
    for i in range(N):
        with h5py.File(root / "h5" / f"{i:05d}.h5", "w") as f:
            f["x"] = np.load(root / f"{i:05d}.npy")


def _edit_per_index_h5_in_place(root: Path) -> None:
    time.sleep(0.02)
    for i in EDITED:
        with h5py.File(root / "h5" / f"{i:05d}.h5", "r+") as f:
            f["x"][:] = np.full(16, 100.0 + i, dtype=np.float32)


def _edit_sample_files(root: Path) -> None:
    for i in EDITED:
        edit_file(root / f"{i:05d}.npy", 100.0 + i)
    _stacked(root)  # the native readers' files carry the same edit


def _edit_stacked_in_place(root: Path) -> None:
    time.sleep(0.02)
    with h5py.File(root / "meta" / "data.h5", "r+") as f:
        for i in EDITED:
            f["x"][i] = np.full(16, 100.0 + i, dtype=np.float32)
    arr = np.load(root / "meta" / "all.npy", mmap_mode="r+")
    for i in EDITED:
        arr[i] = 100.0 + i
    arr.flush()
    del arr


def _relabel(root: Path) -> None:
    _labels(root, {i: 7 for i in EDITED})


PATTERNS = {
    "path list": (PathList, _edit_sample_files),
    "basenames + root": (Basenames, _edit_sample_files),
    "computed from the index": (Computed, _edit_sample_files),
    "read in a thread pool": (ThreadPooled, _edit_sample_files),
    "labels in a JSON dict": (JsonLabels, _relabel),
    "labels in a pandas frame": (CsvLabels, _relabel),
    "labels in csv rows": (CsvRows, _relabel),
    "hdf5 opened natively": (Hdf5Native, _edit_stacked_in_place),
    "hdf5 opened natively in each read": (Hdf5PerRead, _edit_stacked_in_place),
    "memory-mapped array": (Memmapped, _edit_stacked_in_place),
    "hdf5 per index under a root, opened natively": (Hdf5PerIndex, _edit_per_index_h5_in_place),
}
MODES = [("build", 0), ("build", 2), ("fill", 2)]


def _data(tmp_path: Path) -> Path:
    """``data/00000.npy`` … (the samples) and, beside them, ``data/meta/``: labels and the stacked files."""
    root = tmp_path / "data"
    write_arrays(root)
    (root / "meta").mkdir()
    _labels(root)
    _stacked(root)
    _per_index_h5(root)
    return root


def _first_run(backend: str, mode: str, workers: int, dataset: Dataset, root: Path):
    manifest = caches.dataset_key(dataset)
    if mode == "build":
        return open_or_build(backend, dataset, root=root, manifest=manifest, progress=False, workers=workers)
    fill = open_or_fill(backend, dataset, root=root, manifest=manifest)
    for _ in DataLoader(fill, batch_size=4, num_workers=workers, multiprocessing_context="fork" if workers else None,
                        collate_fn=list):
        pass
    deadline = time.monotonic() + 60
    while fill.committed is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fill.committed, fill.result
    fill.close()
    return None


def _served(cache) -> list:
    return [cache[k] for k in range(len(cache))]


@pytest.mark.parametrize("mode,workers", MODES)
@pytest.mark.parametrize("backend", DISK)
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_an_edit_outside_the_probes_is_never_served_stale(tmp_path, pattern, backend, mode, workers):
    make, edit = PATTERNS[pattern]
    data, root = _data(tmp_path), tmp_path / "caches"
    _first_run(backend, mode, workers, make(data), root)
    edit(data)
    live = make(data)
    with pytest.warns(CacheRebuildWarning) as caught:
        cache = open_or_build(backend, live, root=root, manifest=caches.dataset_key(live), progress=False)
    assert cache.origin == "built"
    why = str(caught[0].message)
    if pattern.startswith("labels"):
        assert "in-memory data modified" in why
    elif pattern == "memory-mapped array":  # the mapped array is in-memory data too, read whole
        assert "in-memory data modified: array" in why
    elif pattern == "path list":  # the key lists a path list's files itself
        assert "files modified" in why, why
    else:  # outside the probes, so the key is the same: the record of every source file saw it
        assert "changed since it was built" in why, why
    served = _served(cache)
    assert all(samples_equal(served[i], live[i]) for i in range(N)), "a sample other than dataset[i]"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # unchanged now: reused without a word
        again = open_or_build(backend, make(data), root=root, manifest=caches.dataset_key(make(data)), progress=False)
    assert again.origin == "reused"


def test_a_fill_that_cannot_record_what_its_reads_opened_keeps_nothing_unrecorded(tmp_path):
    """A record is kept only once what its read opened is on record: a process whose record of its sources
    fails (no descriptor left, a full disk) stops keeping, so no cache is committed blind to those files."""
    data, root = _data(tmp_path), tmp_path / "caches"
    edited = [i for i in range(8, N) if i not in probe_indices(N)][:2]  # read after the fill's head
    dataset = Computed(data)
    fill = open_or_fill("pickle", dataset, root=root, manifest=caches.dataset_key(dataset))
    record = fill.staging / f"sources-{os.getpid()}.jsonl"
    record.rename(fill.staging / "sources-0.jsonl")  # the head's record, still read by the commit
    # From here on this process's record cannot be appended to (EINVAL; EMFILE or ENOSPC in the field), while
    # the commit can still read every record file
    record.symlink_to("/proc/version")
    got = [s for batch in DataLoader(fill, batch_size=4, collate_fn=list) for s in batch]
    assert all(samples_equal(got[i], dataset[i]) for i in range(N))
    fill.close()
    for i in edited:
        edit_file(data / f"{i:05d}.npy", 100.0 + i)
    live = Computed(data)
    cache = open_or_build("pickle", live, root=root, manifest=caches.dataset_key(live), progress=False)
    served = _served(cache)
    assert all(samples_equal(served[i], live[i]) for i in range(N)), "a sample other than dataset[i]"


def test_the_record_lists_every_file_the_reads_opened_and_nothing_else(tmp_path):
    data, root = _data(tmp_path), tmp_path / "caches"
    cache = open_or_build("pickle", JsonLabels(data), root=root, manifest=caches.dataset_key(JsonLabels(data)),
                          progress=False, workers=2)
    paths, table = read(cache.path, cache.manifest["sources"])
    assert paths == sorted(str(data / f"{i:05d}.npy") for i in range(N))  # labels.json: opened before any read
    st = os.stat(paths[0])
    assert table[0].tolist() == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def test_files_of_autotune_s_own_folders_elsewhere_are_no_source_but_a_users_open_file_is(tmp_path):
    """Another loader's cache or fill under another cache_dir, held open read-only by this process, is not
    what these samples were made from; a user's file held open (a native reader's) is."""
    from autotune.caches._own import make_own

    data, root = _data(tmp_path), tmp_path / "caches"
    (tmp_path / "elsewhere").mkdir()
    other = make_own(tmp_path / "elsewhere" / ".pickle-fill", "staging")
    (other / "spool-1.bin").write_bytes(b"records")
    (tmp_path / "user.idx").write_bytes(b"index")
    with open(other / "spool-1.bin", "rb"), open(tmp_path / "user.idx", "rb"):
        cache = open_or_build("pickle", JsonLabels(data), root=root, manifest=caches.dataset_key(JsonLabels(data)),
                              progress=False, workers=2)
    paths, _ = read(cache.path, cache.manifest["sources"])
    assert str(other / "spool-1.bin") not in paths
    assert str(tmp_path / "user.idx") in paths
    assert sorted(set(paths) - {str(tmp_path / "user.idx")}) == sorted(str(data / f"{i:05d}.npy") for i in range(N))


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's marker needs root (chown)")
def test_a_marker_another_user_planted_in_a_data_folder_blinds_no_record(tmp_path):
    """autotune's own folders are not sources; a folder holding a marker that another user wrote is not
    autotune's, so its files stay in the record and an edit of them is seen."""
    from autotune.caches._own import MARKER, mark

    data, root = _data(tmp_path), tmp_path / "caches"
    mark(data, "staging")
    os.chown(data / MARKER, 65534, 65534)
    os.chown(data, 65534, 65534)
    cache = open_or_build("pickle", Computed(data), root=root, manifest=caches.dataset_key(Computed(data)),
                          progress=False)
    paths, _ = read(cache.path, cache.manifest["sources"])
    assert set(paths) >= {str(data / f"{i:05d}.npy") for i in range(N)}


def test_a_symbolic_link_retargeted_reads_as_another_file(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_arrays(a)
    write_arrays(b)
    edit_file(b / f"{EDITED[0]:05d}.npy", -1.0)
    link = tmp_path / "current"
    link.symlink_to(a)
    root = tmp_path / "caches"
    open_or_build("lmdb", Computed(link), root=root, manifest=caches.dataset_key(Computed(link)), progress=False)
    link.unlink()
    link.symlink_to(b)
    with pytest.warns(CacheRebuildWarning):
        cache = open_or_build("lmdb", Computed(link), root=root, manifest=caches.dataset_key(Computed(link)),
                              progress=False)
    assert float(cache[EDITED[0]][0][0]) == -1.0


def test_a_deleted_source_file_makes_the_cache_stale(tmp_path):
    data, root = _data(tmp_path), tmp_path / "caches"
    cache = open_or_build("pickle", PathList(data), root=root, manifest=caches.dataset_key(PathList(data)),
                          progress=False)
    os.rename(data / f"{EDITED[0]:05d}.npy", tmp_path / "moved.npy")
    assert changed(cache.path, cache.manifest["sources"]) == [str(data / f"{EDITED[0]:05d}.npy")]


def test_data_dir_adds_every_file_under_it_to_the_record(tmp_path):
    """Files read by native code that opens and closes them inside one call are seen no other way."""
    data, root = _data(tmp_path), tmp_path / "caches"
    (data / "unread.bin").write_bytes(b"x")
    manifest = caches.dataset_key(Computed(data), data_dir=data)
    cache = open_or_build("hdf5", Computed(data), root=root, manifest=manifest, progress=False)
    assert str((data / "unread.bin").resolve()) in read(cache.path, cache.manifest["sources"])[0]


def test_a_scan_sees_files_held_open_or_mapped_by_native_code_and_not_written_ones(tmp_path):
    data = _data(tmp_path)
    handle = h5py.File(data / "meta" / "data.h5", "r")
    mapped = np.load(data / "meta" / "all.npy", mmap_mode="r")
    log = open(tmp_path / "train.log", "w")  # noqa: SIM115 - held open for the scan
    try:
        sources = Sources()
        sources.scan_process(maps=True)
        kept = sources.kept()
    finally:
        handle.close()
        log.close()
        del mapped
    assert str(data / "meta" / "data.h5") in kept and str(data / "meta" / "all.npy") in kept
    assert str(tmp_path / "train.log") not in kept
    assert not any(p.endswith(".so") or "site-packages" in p for p in kept)


# --------------------------------------------------------------------- samples that are not one sample
class EpochSeeded(Computed):
    """Augmentation seeded by the epoch (``set_epoch``), from a generator made per read."""

    def __init__(self, root):
        super().__init__(root)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x + float(np.random.default_rng(self.epoch * 1000 + i).random()), y


class WorkerSeeded(Computed):
    """Noise seeded by the worker's seed (different in every worker and every run)."""

    def __getitem__(self, i):
        info = get_worker_info()
        seed = 0 if info is None else info.seed % (2**32)
        x, y = super().__getitem__(i)
        return x + float(np.random.default_rng(seed + i).random()), y


class SometimesFlipped(Computed):
    """A flip with p=0.1: two reads agree nine times in ten, but every read draws."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return (x.flip(0) if np.random.rand() < 0.1 else x), y


class OwnGenerator(Computed):
    """A generator the dataset holds."""

    def __init__(self, root):
        super().__init__(root)
        self.rng = np.random.default_rng(0)

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x + (1.0 if self.rng.random() < 0.01 else 0.0), y


class Deterministic(Computed):
    """Seeds a private generator from the index: the same sample every read (must stay cacheable)."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x + float(np.random.default_rng(i).random()), y


@pytest.mark.parametrize("cls,why", [
    (EpochSeeded, "changes with set_epoch()"),
    (WorkerSeeded, "differs between the main process and a DataLoader worker"),
    (SometimesFlipped, "drew from numpy's global random state"),
    (OwnGenerator, "drew from the generator dataset.rng"),
])
def test_the_determinism_check_refuses_samples_that_are_not_one_sample(tmp_path, cls, why):
    from autotune.dataset._determinism import check_deterministic

    dataset = cls(_data(tmp_path))
    ok, reason = check_deterministic(dataset)
    assert not ok and why in reason and "transform" in reason and "\n" not in reason
    if cls is EpochSeeded:
        assert dataset.epoch == 0, "the user's dataset was not moved to another epoch"


def test_a_dataset_seeded_from_the_index_is_still_cacheable(tmp_path):
    from autotune.dataset._determinism import check_deterministic

    assert check_deterministic(Deterministic(_data(tmp_path))) == (True, "")


@pytest.mark.parametrize("backend", ("memory", *DISK))
@pytest.mark.parametrize("workers", (0, 2))
def test_a_build_that_finds_a_draw_stores_nothing_and_the_factory_reads_the_source(tmp_path, backend, workers,
                                                                                      monkeypatch):
    """Randomness the up-front check did not see (here: it is skipped) is found by the build itself."""
    import autotune
    from autotune.loader import _source

    monkeypatch.setattr(_source, "check_deterministic", lambda dataset: (True, ""))
    monkeypatch.setattr(_source, "build_workers", lambda: workers)
    data, root = _data(tmp_path), tmp_path / "caches"
    recipe = _write_recipe(tmp_path, backend)
    with pytest.warns(UserWarning, match=r"cache is not used: dataset\[\d+\] drew from numpy's global"):
        loader = autotune.load(recipe).dataloader(SometimesFlipped(data), cache_dir=root, progress=False,
                                                  shuffle=False)
    assert loader.autotune.settings["cache"] is None
    assert len([b for b in loader]) == N // 4
    assert not root.exists() or [p.name for p in root.iterdir()
                                 if p.name not in ("CACHEDIR.TAG", ".autotune-key")
                                 and not p.name.endswith(".lock")] == []


def _write_recipe(tmp_path: Path, backend: str, fill: str = "build") -> Path:
    from autotune.config import LoaderConfig
    from autotune.machine import _hardware as hardware
    from autotune.recipe._file import Profile, RecipeFile
    from autotune.recipe._measured import Measured

    profile = Profile(hardware=hardware.collect(), dataset={"source": "<python object>", "length": N},
                      settings={"batch_size": 4, "epochs": 2},
                      config=LoaderConfig(cache=backend, cache_fill=fill), measured=Measured())
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, profile)
    return path


@pytest.mark.parametrize("backend", ("memory", *DISK))
def test_a_fill_that_finds_a_draw_keeps_nothing_and_every_epoch_is_the_source(tmp_path, backend):
    from autotune.caches._fill import FirstEpochCache

    data, root = _data(tmp_path), tmp_path / "caches"
    dataset = SometimesFlipped(data)
    fill = FirstEpochCache(dataset) if backend == "memory" else open_or_fill(
        backend, dataset, root=root, manifest=caches.dataset_key(dataset))
    for _ in range(2):
        np.random.seed(1)
        got = [fill[k] for k in range(N)]
        np.random.seed(1)
        want = [dataset[k] for k in range(N)]
        assert all(samples_equal(a, b) for a, b in zip(got, want))
    assert not fill.whole
    if backend != "memory":
        fill.close()
        assert fill.committed in (None, False)
        assert [e for e in caches.list_caches(root) if e["kind"] == "cache"] == []


class DrawsAtOne(Computed):
    """Draws at one index only, in the middle of a batch: a batch's watch must still name that index."""

    ONE = 13

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return (x + float(np.random.rand()) if i == self.ONE else x), y


@pytest.mark.parametrize("workers", (0, 2))
def test_a_draw_inside_a_watched_batch_is_named_by_its_index(tmp_path, workers, caplog):
    """Builds and fills watch the generators once per batch, not per read: the index that drew is still
    the one named, in the build's error and in the fill's warning."""
    from autotune.caches._base import read_source
    from autotune.caches._draws import RandomSamples, last_line
    from autotune.caches._fill import FirstEpochCache, GatheringFill
    from autotune.caches._gather import collate_gathered
    from autotune.caches._memory import MemoryCache

    dataset = DrawsAtOne(_data(tmp_path))
    for build in (lambda: MemoryCache.build(dataset, range(N), manifest={}, progress=False, workers=workers),
                  lambda: list(read_source(dataset, list(range(N)), workers=workers, progress=False))):
        with pytest.raises(RandomSamples) as raised:
            build()
        assert last_line(raised.value).startswith("dataset[13] drew from numpy's global random state, so no cache")
    fill = FirstEpochCache(dataset)
    loader = torch.utils.data.DataLoader(GatheringFill(fill), batch_size=8, num_workers=workers,
                                         collate_fn=collate_gathered, multiprocessing_context="fork" if workers else None)
    with caplog.at_level("WARNING", logger="autotune"):
        batches = [b for b in loader]
    assert len(batches) == N // 8 and not fill.whole and fill.random[0] == 1
    if not workers:  # a worker logs in its own process
        assert "dataset[13] drew from numpy's global random state" in caplog.text


# ----------------------------------------------------------------------- in-memory data, any container
class Holder(Dataset):
    def __init__(self, value):
        self.value = value

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return 0


def _digest(value):
    return caches.dataset_key(Holder(value))["facts"]["data"]


@pytest.mark.parametrize("before,after", [
    ({"a.jpg": 1, "b.jpg": 2}, {"a.jpg": 1, "b.jpg": 3}),
    ([("a.jpg", 1), ("b.jpg", 2)], [("a.jpg", 1), ("b.jpg", 9)]),
    ([["a", [1, 2]], {"k": {3, 4}}], [["a", [1, 2]], {"k": {3, 5}}]),
    ({1: "cat", 2: "dog"}, {1: "cat", 2: "cow"}),
    (np.array([{"y": 1}, "s"], dtype=object), np.array([{"y": 2}, "s"], dtype=object)),
    (pd.DataFrame({"p": ["a", "b"], "y": [1, 2]}), pd.DataFrame({"p": ["a", "b"], "y": [1, 3]})),
    (torch.arange(6), torch.arange(6) * 2),
    ({"frozen": frozenset({"x", "y"})}, {"frozen": frozenset({"x", "z"})}),
])
def test_a_change_in_any_container_changes_the_key(before, after):
    assert _digest(before) != _digest(after)


def test_the_key_of_the_same_contents_is_the_same_in_another_process():
    """Another process, whose strings hash differently (so its sets may iterate in another order),
    keys the same contents as this one."""
    import subprocess
    import sys

    value = {'s': {'alpha', 'beta', 'gamma'}, 'f': frozenset('xyz'), 'd': {2: 'b', 1: 'a'}}
    tests = str(Path(__file__).parent)
    code = (f"import sys; sys.path.insert(0, {tests!r}); from test_provenance import _digest; "
            f"print(hash('alpha')); print(_digest({value!r}))")
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": seed}).stdout
    theirs, digest = out.splitlines()[-2:]
    assert int(theirs) != hash("alpha"), "the other process hashes strings as this one does"
    assert digest == str(_digest(value))


def test_what_cannot_be_read_is_said_once_naming_data_dir_and_cache_none():
    import threading

    from autotune.caches._key import CacheKeyWarning, _said

    _said.discard("Holder")
    lock = threading.Lock()  # a C object with no attributes to read
    with pytest.warns(CacheKeyWarning, match=r"cannot read all that Holder holds in memory \(value "
                                              r"\(_thread\.lock\)\).*data_dir=.*cache=None"):
        caches.dataset_key(Holder(lock))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        caches.dataset_key(Holder(lock))


def test_a_file_object_is_read_as_the_file_it_holds(tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "b").write_text("1")
    with open(tmp_path / "a") as a, open(tmp_path / "b") as b:
        assert _digest(a) != _digest(b)
