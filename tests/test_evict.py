"""Page-cache eviction on real temporary files, checked with mincore; recording the files a dataset opens."""

from __future__ import annotations

import os
import sys
import threading

import pytest
from evict_workloads import FileSamples, HiddenPaths, OneBigFile, page_cache_is_droppable, write_files

from autotune.errors import AutotuneError
from autotune.machine import _evict as evict
from autotune.machine._evict import (
    EFFECTIVE_MAX_RESIDENT,
    dataset_files,
    files_under,
    fits_page_cache,
    record_files,
    resident_fraction,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise + mincore on Linux")
MIB = 1 << 20


@pytest.fixture
def data_dir(tmp_path):
    if not page_cache_is_droppable(tmp_path):
        pytest.skip(f"{tmp_path} is on tmpfs: its pages cannot be evicted")
    return tmp_path


def read_all(path) -> None:
    with open(path, "rb") as f:
        while f.read(MIB):
            pass


@linux_only
def test_read_file_is_resident_and_eviction_drops_it(data_dir):
    (path,) = write_files(data_dir, 1, 4 * MIB)
    read_all(path)
    assert resident_fraction(path) >= 0.9
    report = evict.evict([path])
    assert report.files == 1 and report.bytes == 4 * MIB
    assert report.resident_before >= 0.9
    assert report.resident_after <= 0.1
    assert resident_fraction(path) <= 0.1
    assert report.effective and report.note == ""
    read_all(path)
    assert resident_fraction(path) >= 0.9, "a read brings it back"


@linux_only
def test_report_is_byte_weighted(data_dir):
    big, small = data_dir / "big", data_dir / "small"
    big.write_bytes(os.urandom(3 * MIB))
    small.write_bytes(os.urandom(MIB))
    os.sync()
    read_all(big)
    evict.evict([small])  # small cold, big warm: 3/4 of the bytes resident
    report = evict.evict([big, small])
    assert report.resident_before == pytest.approx(0.75, abs=0.05)
    assert report.resident_after <= 0.1


@linux_only
def test_dirty_pages_are_never_written_by_us_and_are_reported(data_dir):
    """A file still being written has dirty pages; DONTNEED only starts their write-back and drops clean
    ones, so some may stay.  We never fsync the source: the report says what stayed, and the source's
    bytes and modification time are untouched."""
    path = data_dir / "dirty.bin"
    payload = os.urandom(8 * MIB)
    with open(path, "wb") as f:
        f.write(payload)  # no fsync: dirty until the kernel writes it back
    mtime = os.stat(path).st_mtime_ns
    report = evict.evict([path])
    assert report.effective == (report.resident_after <= EFFECTIVE_MAX_RESIDENT)
    if not report.effective:
        assert "still resident after eviction" in report.note and "dirty" in report.note
    assert os.stat(path).st_mtime_ns == mtime
    assert path.read_bytes() == payload


def test_missing_and_empty_files(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert resident_fraction(empty) == 1.0
    assert resident_fraction(tmp_path / "absent") is None
    report = evict.evict([tmp_path / "absent"])
    assert report.files == 0 and not report.effective
    assert "could not be evicted" in report.note
    nothing = evict.evict([])
    assert not nothing.effective and "no files to evict" in nothing.note


def test_without_posix_fadvise_cold_figures_are_warm(tmp_path, monkeypatch):
    (path,) = write_files(tmp_path, 1, 64 << 10)
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    report = evict.evict([path])
    assert not report.effective
    assert report.note == "posix_fadvise not available on this OS: cold figures are warm"


def test_record_files_sees_the_datasets_files_only(tmp_path):
    paths = write_files(tmp_path / "data", 4, 1024)
    unrelated = write_files(tmp_path / "other", 2, 16, prefix="u")
    ds = FileSamples(paths)
    open(unrelated[0], "rb").close()  # before recording: not seen

    def two_samples():
        open(tmp_path / "written.txt", "w").close()  # opened for writing: not a source file
        os.listdir(tmp_path)  # a folder: not a file
        return ds[1], ds[3]

    result, files = record_files(two_samples)
    open(unrelated[1], "rb").close()  # after recording: not seen
    assert result[0][1] == 1 and result[1][1] == 3
    assert files == {os.path.realpath(paths[1]), os.path.realpath(paths[3])}


def test_record_files_skips_code_and_libraries(tmp_path):
    import json

    def reads_code():
        json.dumps({})
        open(json.__file__, "rb").close()  # the standard library
        open(os.__file__, "rb").close()
        return 1

    assert record_files(reads_code) == (1, set())


def test_hook_is_inert_when_not_recording(tmp_path):
    paths = write_files(tmp_path, 2, 16)
    record_files(lambda: None)  # the hook is installed now
    assert evict._recording.get() is None
    evict._hook("open", (paths[0], "rb", 0))  # nothing to record into: returns without effect
    _, files = record_files(lambda: open(paths[1], "rb").close())
    assert files == {os.path.realpath(paths[1])}


def test_a_thread_the_block_waits_on_is_recorded_and_nesting_works(tmp_path):
    """A read's files may be opened on a pool's thread: while a block records, a thread recording nothing
    itself records into it (an unrelated thread's file too: one file too many only costs a needless
    rebuild or eviction, one too few a stale cache or a warm 'cold' epoch)."""
    paths = write_files(tmp_path, 3, 16)
    started, release = threading.Event(), threading.Event()

    def other_thread():
        started.set()
        release.wait(10)
        open(paths[2], "rb").close()

    thread = threading.Thread(target=other_thread)
    thread.start()
    started.wait(10)

    def outer():
        open(paths[0], "rb").close()
        release.set()
        thread.join(10)
        return record_files(lambda: open(paths[1], "rb").close())[1]

    inner, files = record_files(outer)
    assert inner == {os.path.realpath(paths[1])}
    assert files == {os.path.realpath(p) for p in paths}


def test_files_under(tmp_path):
    write_files(tmp_path / "a" / "b", 2, 8)
    (tmp_path / "link").symlink_to(tmp_path / "a" / "b" / "s000.bin")
    found = files_under(tmp_path)
    assert found == {os.path.realpath(tmp_path / "a" / "b" / f"s00{i}.bin") for i in range(2)}
    with pytest.raises(AutotuneError, match="--data-dir must be an existing folder"):
        files_under(tmp_path / "absent")


def test_dataset_files_by_path_list_shared_file_and_recording(tmp_path):
    paths = write_files(tmp_path / "files", 20, 32)
    files, how = dataset_files(FileSamples(paths), [2, 5, 7])
    assert how == "path list" and files == {os.path.realpath(paths[i]) for i in (2, 5, 7)}
    files, how = dataset_files(FileSamples(paths), range(20))
    assert how == "path list" and len(files) == 20

    big = tmp_path / "container.bin"
    big.write_bytes(os.urandom(10 * 4096))
    files, how = dataset_files(OneBigFile(big, 10), range(10))
    assert (files, how) == ({os.path.realpath(big)}, "shared")

    files, how = dataset_files(HiddenPaths(tmp_path / "files", 20), range(0, 20, 2))
    assert how == "recorded" and files == {os.path.realpath(paths[i]) for i in range(0, 20, 2)}


def test_fits_page_cache():
    assert fits_page_cache(1 << 30, available=4 << 30, reserve=2 << 30)
    assert fits_page_cache(2 << 30, available=4 << 30, reserve=2 << 30)
    assert not fits_page_cache((2 << 30) + 1, available=4 << 30, reserve=2 << 30)
    assert not fits_page_cache(10_000_000 * (1 << 20))  # ten million samples of 1 MiB: nowhere
    assert fits_page_cache(1) is True


def test_generated_data_opens_no_files():
    from pathlib import Path

    from autotune.dataset._userfile import import_file

    big_synthetic = import_file(Path(__file__).resolve().parent.parent / "examples" / "big_synthetic.py")
    assert len(big_synthetic.dataset) == 10_000_000
    ds = big_synthetic.BigSynthetic(length=1000, sample_bytes=4096)
    files, how = dataset_files(ds, range(1000))
    assert files == set() and how.startswith("none opened")
    assert bool((ds[7][0] == ds[7][0]).all()) and ds[7][1] == 7
