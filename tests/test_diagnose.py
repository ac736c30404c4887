"""`autotune diagnose` for real on a tiny dataset of files: the measurements, the JSON schema, errors."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from autotune import cli
from autotune.dataset._userfile import UserSpec
from autotune.diagnose._breakdown import diagnose, format_table, read_files, to_json, transfer_seconds

pytestmark = pytest.mark.timeout(120)


class NpyFiles(Dataset):
    """One small .npy file per sample, decoded into a float tensor."""

    def __init__(self, folder: Path, count: int = 24):
        folder.mkdir(parents=True, exist_ok=True)
        self.paths = []
        for i in range(count):
            path = folder / f"{i:03d}.npy"
            np.save(path, np.full((8, 16), i, dtype=np.uint8))
            self.paths.append(str(path))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return torch.from_numpy(np.load(self.paths[i])).float(), i


def double(sample):
    image, label = sample
    return image * 2, label


def consume(batch):
    images, _labels = batch
    return float(images.sum())


MEASUREMENT_KEYS = {
    "source", "length", "samples", "seed", "batch_size", "usable_cpus", "cuda", "sample_cold", "sample_warm",
    "read_cold", "read_warm", "files", "file_bytes_per_sample", "fits_in_memory", "evicted", "transform",
    "collate", "batch_bytes", "sample_bytes", "transfer", "pin", "h2d", "consumer", "consumer_kind",
    "consumer_on_cpu", "notes",
}
VERDICT_KEYS = {
    "bound", "stage", "first_epoch_stage", "stages", "cold_stages", "shares", "loader_cpus", "loader_batch",
    "loader_batch_cold", "ceilings", "summary", "explanation", "helps", "cannot_help",
}


def check_schema(doc: dict) -> None:
    assert doc["schema"] == "autotune-diagnose" and doc["version"] == 1
    m, v = doc["measurements"], doc["verdict"]
    assert MEASUREMENT_KEYS <= set(m)
    assert VERDICT_KEYS <= set(v)
    for key in ("sample_cold", "sample_warm", "collate", "transfer", "transform", "batch_bytes", "sample_bytes"):
        assert isinstance(m[key], (int, float)) and m[key] >= 0, key
    assert v["bound"] in ("consumer", "loader")
    assert v["stage"] in ("storage", "decode", "transform", "collate", "transfer", None)
    assert set(v["ceilings"]) == {"no_stall", "prepared", "cold", "serial", "expected"}
    assert all(r is None or r > 0 for r in v["ceilings"].values())
    assert isinstance(v["summary"], str) and all(isinstance(s, str) for s in v["helps"] + v["cannot_help"])


def test_diagnose_measures_files_transform_collate_and_consumer(tmp_path):
    spec = UserSpec(dataset=NpyFiles(tmp_path / "data"), source="<NpyFiles>", batch_size=4, transform=double,
                    train_step=consume)
    m, v = diagnose(spec, samples=16)
    assert m.samples == 16 and m.length == 24 and m.batch_size == 4
    assert m.files == 16  # one file per sampled index, found by the audit hook
    assert m.read_cold is not None and m.read_warm is not None
    assert m.file_bytes_per_sample == pytest.approx((tmp_path / "data" / "000.npy").stat().st_size)
    assert m.transform > 0 and m.consumer is not None and m.consumer_kind == "train_step"
    assert m.batch_bytes == 4 * (8 * 16 * 4 + 8)  # float32 images and int64 labels
    assert m.pin is None and m.h2d is None  # no CUDA here
    doc = json.loads(json.dumps(to_json(m, v), allow_nan=False))
    check_schema(doc)
    table = format_table(m, v)
    assert "Verdict:" in table
    from autotune.machine._cpus import build_workers

    # the memory-cache build of the same 16 samples against a bare decode of them, same workers
    assert m.build > 0 and m.bare_decode > 0 and m.build_fixed > 0 and m.build_workers == build_workers()
    assert "build vs bare decode" in table and f"of the 16 samples on {build_workers() or 'no'} worker(s)" in table
    # what the cache holds: its columns, the blob offsets and the overflow flags; writing that much
    # fresh memory is measured beside the build
    assert m.build_bytes == 16 * (8 * 16 * 4 + 8) + (16 + 1) * 8 + 16
    assert m.build_first_touch is not None
    assert "first touch of the cache's 8.3 KiB" in table


def test_cli_json_schema(tmp_path, capsys):
    file = tmp_path / "tiny_diag.py"
    file.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from test_diagnose import NpyFiles, consume
        batch_size = 4
        train_step = consume
        def dataset():
            return NpyFiles(Path({str(tmp_path / 'data')!r}), count=12)
    """))
    assert cli.main(["diagnose", str(file), "--json", "--samples", "8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    check_schema(doc)
    assert doc["measurements"]["samples"] == 8
    assert doc["measurements"]["source"].endswith("tiny_diag.py:dataset")


def test_cli_table(tmp_path, capsys):
    file = tmp_path / "tiny_mem.py"
    file.write_text("import torch\nbatch_size = 2\ndataset = [torch.zeros(3) for _ in range(6)]\n")
    assert cli.main(["diagnose", str(file), "--samples", "4"]) == 0
    out = capsys.readouterr().out
    assert "dataset[i] warm" in out and "n/a (no CUDA)" in out and "Verdict: loader-bound" in out


@pytest.mark.parametrize("argv,message", [
    (["diagnose", "no_such_file.py"], "No such dataset file"),
    (["diagnose", "FILE", "--samples", "0"], "--samples must be a positive integer"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    file = tmp_path / "ok_data.py"
    file.write_text("dataset = [1, 2, 3]\n")
    argv = [str(file) if a == "FILE" else a for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_failing_train_step_is_a_dataset_error(tmp_path, capsys):
    file = tmp_path / "bad_step.py"
    file.write_text("import torch\ndataset = [torch.zeros(2)] * 4\nbatch_size = 2\n"
                    "def train_step(batch):\n    raise ValueError('boom')\n")
    assert cli.main(["diagnose", str(file)]) == 2
    assert "train_step raised ValueError: boom" in capsys.readouterr().err


def test_read_files_counts_bytes_and_extrapolates_past_the_cap(tmp_path):
    paths = []
    for i in range(3):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x" * (3 << 20))
        paths.append(str(path))
    seconds, total = read_files(paths, cap=2 << 20)
    assert total == 9 << 20
    assert read_files(paths, cap=0) == (0.0, 9 << 20)  # past the cap nothing is read, nothing is timed


def test_transfer_is_measured_with_a_real_worker():
    batches = [torch.zeros(256, 256), torch.ones(256, 256)]
    assert math.isfinite(transfer_seconds(batches, count=4, rounds=1))  # a real worker ran and returned
    assert transfer_seconds([], count=4, rounds=1) == 0.0
