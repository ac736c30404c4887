"""autotune deletes only what it marked as its own: a folder named like a trial, a build's temp folder
or a fill's staging folder is left alone unless autotune wrote its marker inside it (caches/_own.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune import caches
from autotune.caches._own import MARKER, is_own, make_own, mark
from autotune.caches._trials import remove_leftovers, trial_folder
from autotune.cli._main import main

pytestmark = pytest.mark.timeout(240)


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def _users_folders(root: Path) -> dict[Path, Path]:
    """Folders a user made whose names look like autotune's, each holding the user's file."""
    made = {}
    for name in ("trial-2024", "trial-experiment-1", f"trial-host-{_dead_pid()}-abcdefgh", ".pickle-x.tmp-1-ab",
                 ".hdf5-x.fill-1-ab", ".lmdb-x.old-1-ab", ".pickle-x-0123.tmp-2-cd"):
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "results.csv").write_text("epoch,loss\n1,0.5\n")
        made[folder] = folder / "results.csv"
    (root / "trial-empty").mkdir()  # nothing inside: still not autotune's
    made[root / "trial-empty"] = root / "trial-empty"
    return made


def test_cache_clear_leaves_folders_named_like_autotunes_that_it_did_not_mark(tmp_path, capsys):
    data = tmp_path / "data"
    made = _users_folders(data)
    assert main(["cache", "clear", "--dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert f"Removed 0 caches from {data}." in out
    for folder, inside in made.items():
        assert inside.exists(), f"{inside} was removed"
        assert f"Left {folder} untouched: not autotune's." in out
    assert main(["cache", "list", "--dir", str(data)]) == 0
    listed = capsys.readouterr().out
    assert "not marked as its own" in listed and "partial" not in listed and "leftover" not in listed


def test_the_search_leaves_a_users_folder_in_its_trials_folder(tmp_path, monkeypatch, capsys):
    wd = tmp_path / "wd"
    results = wd / "cache" / "trials" / "trial-experiment-1" / "results.csv"
    results.parent.mkdir(parents=True)
    results.write_text("epoch,loss\n1,0.5\n")
    (tmp_path / "ramp.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import Dataset

        class Ramp(Dataset):
            def __len__(self):
                return 32
            def __getitem__(self, i):
                return torch.arange(8, dtype=torch.float32) + i

        dataset = Ramp()
        batch_size = 8
        epochs = 1
    """))
    monkeypatch.chdir(tmp_path)
    code = main(["search", "ramp.py", "--workdir", str(wd), "--budget", "15s", "--caches", "pickle",
                 "--max-workers", "0", "--no-progress"])
    assert code == 0, capsys.readouterr()
    assert results.read_text() == "epoch,loss\n1,0.5\n"
    assert sorted(p.name for p in results.parent.parent.iterdir()) == ["trial-experiment-1"]


def test_marked_leftovers_are_removed_and_everything_else_stays(tmp_path):
    mine = Path(trial_folder(tmp_path))  # this search is alive: not a leftover
    gone = tmp_path / mine.name.replace(f"-{os.getpid()}-", f"-{_dead_pid()}-")
    make_own(gone, "trial")
    unmarked_gone = tmp_path / mine.name.replace(f"-{os.getpid()}-", f"-{_dead_pid()}-x")
    unmarked_gone.mkdir()
    elsewhere = tmp_path / "outside"
    make_own(elsewhere, "trial")
    link = tmp_path / f"trial-host-{_dead_pid()}-linked"
    link.symlink_to(elsewhere, target_is_directory=True)  # a link to a marked folder is not one
    fake_marker = tmp_path / f"trial-host-{_dead_pid()}-fake"
    fake_marker.mkdir()
    (fake_marker / MARKER).symlink_to(elsewhere / MARKER)  # nor is a folder whose marker is a link
    assert remove_leftovers(tmp_path) == [gone]
    assert sorted(tmp_path.iterdir()) == sorted([mine, unmarked_gone, elsewhere, link, fake_marker])
    assert is_own(mine) and is_own(elsewhere) and not is_own(link) and not is_own(fake_marker)


def test_a_marked_temp_folder_of_a_dead_builder_is_removed_and_an_unmarked_one_stays(tmp_path, capsys):
    cache = caches.open_or_build("pickle", list(range(20)), root=tmp_path, manifest={"key": "x"}, progress=False)
    name = cache.path.name
    dead = make_own(tmp_path / f".{name}.tmp-{_dead_pid()}-0a1b", "build")
    (dead / "data.bin").write_bytes(b"partial")
    user = tmp_path / f".{name}.tmp-{_dead_pid()}-2c3d"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    assert {Path(e["path"]).name: e["status"] for e in caches.list_caches(tmp_path)} == {
        name: "valid", dead.name: "partial", user.name: "foreign"}
    result = caches.clear_caches(tmp_path)
    assert result["removed"] == [str(dead)] and result["in_use"] == [str(cache.path)]  # this test holds it
    assert result["foreign"] == [str(user)] and (user / "notes.txt").read_text() == "mine"
    path = cache.path
    del cache
    assert caches.clear_caches(tmp_path)["removed"] == [str(path)]


def test_every_folder_autotune_makes_to_delete_later_is_marked(tmp_path):
    """Builds, fills and their commits, and set-aside caches write the marker as they make the folder, so
    a killed process's folder is still recognised."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from autotune.caches._registry import open_or_fill
        from test_disk_fill import Mixed
        fill = open_or_fill("hdf5", Mixed(), root={str(tmp_path)!r}, manifest={{"key": "m"}})
        print(fill.staging, flush=True)
        os._exit(9)  # killed: the staging folder stays behind
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    staging = Path(done.stdout.strip())
    assert staging.is_dir() and is_own(staging)
    assert [e["status"] for e in caches.list_caches(tmp_path)] == ["partial"]
    assert caches.clear_caches(tmp_path)["removed"] == [str(staging)] and not staging.exists()
    mark(tmp_path, "test")  # the marker refuses to be written twice (O_EXCL): no one else's file is reused
    with pytest.raises(FileExistsError):
        mark(tmp_path, "test")


def test_a_trial_folder_whose_search_is_a_zombie_is_a_leftover(tmp_path):
    """A killed search not yet reaped by its parent is a zombie: its pid still answers kill(0), but it runs
    nothing, so its trial folder is a leftover `cache clear` may remove (it was called "trial running")."""
    import time

    from autotune.caches._trials import is_leftover

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.01)
        folder = Path(trial_folder(tmp_path))
        named = folder.with_name(folder.name.replace(f"-{os.getpid()}-", f"-{pid}-"))
        assert f"-{pid}-" in named.name and is_leftover(named)
        assert not is_leftover(folder)  # this process runs
    finally:
        os.waitpid(pid, 0)
