"""This machine's floor: one decode pass of every sample on every usable CPU (nothing stored), then the
epochs' batch gathers from memory; scaled from a subset, reported by ``autotune diagnose`` and by the
benchmarks as a row every other row is divided by. Structure and arithmetic only, never timings."""

from __future__ import annotations

import math
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from autotune import cli
from autotune.dataset import Floor, GatherEpochs, measure_floor, rows_in_memory
from autotune.dataset._userfile import UserSpec
from autotune.diagnose._breakdown import diagnose, format_table, to_json
from autotune.machine import build_workers, usable_cpus

pytestmark = pytest.mark.timeout(120)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


class Logged(Dataset):
    """One .npy file per sample; every read appends its index and pid to a log, whatever process reads."""

    def __init__(self, folder: Path, count: int = 20):
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "reads.log"
        self.paths = []
        for i in range(count):
            path = folder / f"{i:03d}.npy"
            np.save(path, np.full((4, 8), i, dtype=np.float32))
            self.paths.append(str(path))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        with open(self.log, "a") as f:
            f.write(f"{i} {os.getpid()}\n")
        return torch.from_numpy(np.load(self.paths[i])), i

    def reads(self) -> list[tuple[int, int]]:
        if not self.log.exists():
            return []
        return [tuple(map(int, line.split())) for line in self.log.read_text().splitlines()]


def test_the_floor_is_the_decode_plus_every_epochs_gathers_scaled_to_the_dataset():
    floor = Floor(length=100, samples=25, batch_size=10, epochs=3, workers=2, decode_seconds=0.5, gather_seconds=0.1)
    assert floor.scale == 4.0
    assert floor.decode_total == pytest.approx(2.0) and floor.gathers_total == pytest.approx(1.2)
    assert floor.total == pytest.approx(3.2)
    assert floor.ratio(6.4) == pytest.approx(2.0) and floor.ratio(3.2) == pytest.approx(1.0)
    assert Floor(length=1, samples=1, batch_size=1, epochs=1, workers=0, decode_seconds=0.0,
                 gather_seconds=0.0).ratio(1.0) is None
    d = floor.to_dict()
    assert d["total"] == pytest.approx(3.2) and d["decode_total"] == pytest.approx(2.0) and d["workers"] == 2


def test_the_gathers_give_every_row_once_an_epoch_into_one_reused_buffer():
    rows = rows_in_memory(10, 12)  # 12 bytes: three float32 words a row
    assert rows.shape == (10, 3) and bool((rows == 1).all())
    rows.copy_(torch.arange(10, dtype=torch.float32)[:, None].expand(10, 3))
    epochs = GatherEpochs(rows, 4, seed=0)
    assert len(epochs) == 3
    orders, buffers = [], set()
    for _ in range(2):
        seen = []
        for batch in epochs:
            assert bool((batch == batch[:, :1]).all())  # whole rows
            seen += batch[:, 0].int().tolist()
            buffers.add((len(batch), batch.data_ptr()))
        assert sorted(seen) == list(range(10))
        orders.append(seen)
    assert orders[0] != orders[1], "each epoch is a new shuffled order"
    assert len(buffers) == 2, "one buffer per batch length (4, and the last batch's 2), reused every batch"
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(0)).tolist()
    assert orders[0] == expected, "the order is the seeded one a shuffled loader draws"


def test_gathers_over_a_large_dataset_are_timed_on_rows_that_fit_and_scaled():
    from autotune.dataset._floor import GATHER_BYTES, held_rows

    assert held_rows(100, 1024, 8) == 100  # all of them fit
    row = 602_112  # a 3x224x224 float image
    assert held_rows(2000, row, 64) == GATHER_BYTES // row == 445
    assert held_rows(10, GATHER_BYTES, 4) == 4, "at least a batch"
    assert held_rows(3, GATHER_BYTES, 64) == 3


def test_measure_floor_decodes_each_sample_once_on_every_usable_cpu(tmp_path):
    dataset = Logged(tmp_path / "data")
    indices = [3, 5, 7, 11, 13, 17]
    floor = measure_floor(dataset, indices, batch_size=4, epochs=2, files=set(dataset.paths))
    assert floor.workers == build_workers() == (usable_cpus() if usable_cpus() > 1 else 0)
    assert (floor.length, floor.samples, floor.batch_size, floor.epochs) == (20, 6, 4, 2)
    assert all(isinstance(x, float) and math.isfinite(x) for x in (floor.decode_seconds, floor.gather_seconds))
    reads = dataset.reads()
    # one read in this process for the sample's size, then each index once in the decode's processes
    assert reads[0] == (3, os.getpid())
    decoded = reads[1:]
    assert sorted(i for i, _ in decoded) == sorted(indices)
    if floor.workers:
        assert os.getpid() not in {pid for _, pid in decoded}, "the decode ran in worker processes"
    assert floor.total == pytest.approx(floor.decode_total + floor.gathers_total)
    assert floor.decode_total == pytest.approx(floor.decode_seconds * 20 / 6)


def test_diagnose_reports_the_floor_and_a_recipe_as_a_multiple_of_it(tmp_path):
    dataset = Logged(tmp_path / "data")
    spec = UserSpec(dataset=dataset, source="<Logged>", batch_size=4, epochs=3)
    m, v = diagnose(spec, samples=8, recipe=(12.5, "num_workers=2"))
    assert m.epochs == 3 and m.floor_workers == build_workers()
    assert m.floor == pytest.approx(m.floor_decode + m.floor_gathers) and m.floor > 0
    assert m.floor_decode == pytest.approx(m.bare_decode * 20 / 8), "the build comparison's decode, scaled"
    assert m.recipe_total == 12.5 and m.over_floor == pytest.approx(12.5 / m.floor)
    doc = to_json(m, v)["measurements"]
    assert {"epochs", "floor", "floor_decode", "floor_gathers", "floor_workers", "recipe_total", "recipe_config",
            "over_floor"} <= set(doc)
    table = format_table(m, v)
    assert "Floor of this machine for the whole run (20 samples, 3 epochs, batch size 4; measured on 8)" in table
    assert "every sample decoded once on" in table and "3 epochs of batch gathers from samples in memory" in table
    assert f"the recipe (num_workers=2), predicted 12.50 s: {12.5 / m.floor:.2f}x the floor" in table
    m2, v2 = diagnose(spec, samples=8)
    assert m2.over_floor is None and "x the floor" not in format_table(m2, v2)


def test_cli_diagnose_reads_the_recipe_for_the_floor(tmp_path, capsys):
    from autotune.config import LoaderConfig
    from autotune.machine import _hardware as hardware
    from autotune.recipe._file import Profile, RecipeFile
    from autotune.recipe._measured import Measured, RunFigures
    from autotune.recipe._records import DatasetRecord, RunSettings

    file = tmp_path / "tiny_floor.py"
    file.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from test_floor import Logged
        batch_size = 4
        epochs = 2
        def dataset():
            return Logged(Path({str(tmp_path / 'data')!r}), count=12)
    """))
    recipe = tmp_path / "autotune.json"
    RecipeFile.merge_write(recipe, Profile(
        hardware=hardware.collect(), dataset=DatasetRecord(source=str(file), length=12),
        settings=RunSettings(batch_size=4, epochs=2), config=LoaderConfig(num_workers=1),
        measured=Measured(chosen=RunFigures(total_seconds=3.0))))
    assert cli.main(["diagnose", str(file), "--samples", "8", "--recipe", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "Floor of this machine for the whole run (12 samples, 2 epochs" in out
    assert "the recipe (num_workers=1, " in out and "), predicted 3.00 s: " in out and "x the floor" in out
    assert cli.main(["diagnose", str(file), "--samples", "8", "--recipe", str(tmp_path / "none.json")]) == 2


def test_every_benchmark_row_is_divided_by_the_floor_row():
    from harness.floor import over_floor

    def row(median):
        return {"total_s": {"median": median, "min": median, "max": median, "n": 1}}

    rows = {"A": row(7.8), "autotune": row(1.95), "floor": row(1.3), "broken": {"failed": ["x"]}}
    assert over_floor(rows) == {"A": pytest.approx(6.0), "autotune": pytest.approx(1.5), "floor": 1.0,
                                "broken": None}
    assert over_floor({"A": row(7.8)}) == {"A": None}, "no floor row: no ratio"


def test_the_floor_row_adds_what_keeping_the_samples_costs():
    """The floor's runs measure, outside their clock, their samples' bytes written into fresh memory once:
    the floor plus that median, and every row's total over it (the floor's own total is left as it is)."""
    from harness.floor import keep_row

    def row(median, keeps=()):
        return {"total_s": {"median": median, "min": median, "max": median, "n": 1},
                "runs": [{"info": {"keep_s": k}} for k in keeps]}

    rows = {"autotune": row(3.4), "floor": row(2.5, (0.4, 0.5, 0.9)), "broken": {"failed": ["x"]}}
    kept = keep_row(rows)
    assert kept == {"keep_s": 0.5, "floor_plus_keep_s": pytest.approx(3.0),
                    "over": {"autotune": pytest.approx(3.4 / 3.0), "floor": pytest.approx(2.5 / 3.0)}}
    assert keep_row({"autotune": row(3.4), "floor": row(2.5)}) is None, "runs that measured no keeping"
    assert keep_row({"autotune": row(3.4)}) is None, "no floor row"
