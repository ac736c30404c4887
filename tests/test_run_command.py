"""`autotune run`: the recipe's process settings applied to a real child, --dry-run, errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import _run as run_cmd
from autotune.cli._main import build_parser, main
from autotune.machine import _hardware as hardware
from autotune.process import _allocator as allocator
from autotune.process import _family as allocators
from autotune.process._settings import ProcessSettings

REPO = Path(__file__).resolve().parents[1]
TCMALLOC = allocators.get("tcmalloc").library()


def write_recipe(path: Path, config: dict, hw: dict | None = None) -> Path:
    """A recipe written by hand: one profile whose "config" holds ``config``, for this machine unless
    ``hw`` says otherwise."""
    hw = hardware.collect() if hw is None else hw
    data = {
        "format": "autotune-recipe",
        "version": 2,
        "profiles": {
            hardware.fingerprint(hw): {
                "hardware": hw,
                "dataset": {"source": "examples/jpeg_folder.py", "length": 2000},
                "config": config,
            }
        },
    }
    path.write_text(json.dumps(data))
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def autotune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


REPORT = (
    "import json, os; print(json.dumps({"
    "'maps': open('/proc/self/maps').read(), "
    "'env': {k: os.environ.get(k) for k in ('LD_PRELOAD', 'OMP_NUM_THREADS', 'MALLOC_MMAP_THRESHOLD_')}}))"
)


def test_parser_takes_everything_after_the_double_dash():
    args = build_parser().parse_args(["run", "--recipe", "r.json", "--", "python", "train.py", "--dry-run", "-x"])
    assert args.recipe == "r.json"
    assert args.dry_run is False
    assert args.cmd[-4:] == ["python", "train.py", "--dry-run", "-x"]


def test_dry_run_prints_environment_and_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, str(tmp_path))
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    recipe = write_recipe(tmp_path / "autotune.json", {"allocator": "tcmalloc", "main_threads": 2})
    code = main(["run", "--recipe", str(recipe), "--dry-run", "--", "python", "my train.py", "--lr", "0.1"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out.splitlines() == [f"LD_PRELOAD={lib}", "OMP_NUM_THREADS=2", "MKL_NUM_THREADS=2",
                                 "python 'my train.py' --lr 0.1"]
    assert err == ""


def test_dry_run_says_when_the_library_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, str(tmp_path))  # an empty folder
    monkeypatch.setattr(allocator, "is_glibc", lambda: True)
    for k in ("LD_PRELOAD", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(k, raising=False)
    recipe = write_recipe(tmp_path / "autotune.json", {"allocator": "jemalloc"})
    assert main(["run", "--recipe", str(recipe), "--dry-run", "--", "python", "train.py"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"MALLOC_MMAP_THRESHOLD_={1 << 30}",
        f"MALLOC_TRIM_THRESHOLD_={1 << 30}",
        "python train.py",
    ]
    assert err == (
        "autotune run: note: jemalloc not available: libjemalloc.so.2 not found; install it with "
        "`apt-get install libjemalloc2`; using glibc-tuned instead\n"
    )


def test_missing_command_is_a_one_line_error(tmp_path):
    recipe = write_recipe(tmp_path / "autotune.json", {})
    for args in (["run", "--recipe", str(recipe)], ["run", "--recipe", str(recipe), "--"]):
        result = autotune(*args)
        assert result.returncode == 2
        assert result.stderr == (
            "autotune: error: autotune run needs a command after `--`, "
            "e.g. `autotune run -- python train.py`\n"
        )


def test_missing_recipe_is_a_one_line_error(tmp_path):
    result = autotune("run", "--recipe", str(tmp_path / "none.json"), "--", "true")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "No recipe file at" in result.stderr


def test_command_that_cannot_start_exits_127(tmp_path):
    recipe = write_recipe(tmp_path / "autotune.json", {})
    result = autotune("run", "--recipe", str(recipe), "--", str(tmp_path / "no-such-program"))
    assert result.returncode == 127
    assert result.stderr.splitlines()[-1] == (
        f"autotune: error: cannot start '{tmp_path / 'no-such-program'}': No such file or directory; "
        "check the command after `--`"
    )


@pytest.mark.timeout(120)
def test_run_passes_exit_status_and_environment_through(tmp_path):
    recipe = write_recipe(tmp_path / "autotune.json", {"allocator": "glibc-tuned", "main_threads": 1})
    result = autotune("run", "--recipe", str(recipe), "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert result.returncode == 7
    assert result.stderr.startswith("autotune run: ")
    result = autotune("run", "--recipe", str(recipe), "--", sys.executable, "-c", REPORT)
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout)["env"]
    assert env["OMP_NUM_THREADS"] == "1"
    if allocator.is_glibc():
        assert env["MALLOC_MMAP_THRESHOLD_"] == str(1 << 30)
        assert result.stderr == (
            f"autotune run: MALLOC_MMAP_THRESHOLD_={1 << 30} MALLOC_TRIM_THRESHOLD_={1 << 30} "
            "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 (allocator=glibc-tuned, main_threads=1)\n"
        )


@pytest.mark.timeout(120)
def test_run_preloads_the_recipe_allocator(tmp_path):
    if TCMALLOC is None:
        pytest.skip("tcmalloc is not installed here (apt-get install libtcmalloc-minimal4)")
    recipe = write_recipe(tmp_path / "autotune.json", {"allocator": "tcmalloc"})
    result = autotune("run", "--recipe", str(recipe), "--", sys.executable, "-c", REPORT)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["env"]["LD_PRELOAD"] == TCMALLOC
    assert os.path.realpath(TCMALLOC) in report["maps"] or TCMALLOC in report["maps"]


@pytest.mark.timeout(120)
def test_run_falls_back_with_a_message_when_the_library_is_missing(tmp_path):
    empty = tmp_path / "no-libraries"
    empty.mkdir()
    recipe = write_recipe(tmp_path / "autotune.json", {"allocator": "tcmalloc"})
    env = clean_env(**{allocator.ENV_LIBRARY_PATH: str(empty)})
    result = autotune("run", "--recipe", str(recipe), "--", sys.executable, "-c", REPORT, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["env"]["LD_PRELOAD"] is None
    assert "tcmalloc" not in report["maps"]
    fallback = "glibc-tuned" if allocator.is_glibc() else "glibc"
    assert result.stderr.splitlines()[0] == (
        "autotune run: note: tcmalloc not available: libtcmalloc_minimal.so.4 not found; install it "
        f"with `apt-get install libtcmalloc-minimal4`; using {fallback} instead"
    )


def test_other_machine_profile_is_used_with_a_note(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    hw = dict(hardware.collect())
    hw["cpu_model"] = "Some Other CPU"
    hw.pop("fingerprint", None)
    recipe = write_recipe(tmp_path / "autotune.json", {"main_threads": 3}, hw=hw)
    assert main(["run", "--recipe", str(recipe), "--dry-run", "--", "true"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["OMP_NUM_THREADS=3", "MKL_NUM_THREADS=3", "true"]
    assert err.startswith("autotune run: note: No profile in ")
    assert err.count("\n") == 1
    assert main(["run", "--recipe", str(recipe), "--on-mismatch", "error", "--dry-run", "--", "true"]) == 3


def test_start_takes_settings_directly():
    out, err = io.StringIO(), io.StringIO()
    code = run_cmd.start(
        ProcessSettings(main_threads=4),
        ["python", "train.py"],
        base_env={"MKL_NUM_THREADS": "1", "HOME": "/root"},
        dry_run=True,
        notes=["a note"],
        out=out,
        err=err,
    )
    assert code == 0
    assert out.getvalue() == "MKL_NUM_THREADS=4\nOMP_NUM_THREADS=4\npython train.py\n"
    assert err.getvalue() == "autotune run: note: a note\n"


def test_run_applies_the_searched_main_thread_count_in_the_child(tmp_path):
    """The recipe's main_threads reach the started program: its environment and torch's thread pool."""
    recipe = write_recipe(tmp_path / "autotune.json", {"main_threads": 1})  # torch alone would take 2 here
    probe = ("import json, os, torch; print(json.dumps({'omp': os.environ.get('OMP_NUM_THREADS'), "
             "'mkl': os.environ.get('MKL_NUM_THREADS'), 'torch': torch.get_num_threads()}))")
    result = autotune("run", "--recipe", str(recipe), "--", sys.executable, "-c", probe)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"omp": "1", "mkl": "1", "torch": 1}
