"""`autotune report` on a real tiny search: the HTML file and PNGs are written with every section;
without the study the report draws what the recipe alone holds and says so."""

from __future__ import annotations

import base64
import json
import re

import pytest
from workloads import Numbers

from autotune import cli
from autotune._api import search_spec
from autotune.dataset._userfile import UserSpec
from autotune.diagnose._report import SECTIONS, build_report, load_trials
from autotune.tuner._study import SearchOptions

pytestmark = pytest.mark.timeout(180)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("report")
    spec = UserSpec(dataset=Numbers(48), source="<python object: Numbers>", batch_size=8, epochs=2)
    opts = SearchOptions(budget=10, workdir=tmp_path / ".autotune", progress=False, caches=("none",),
                         allocators=("glibc",))
    search_spec(spec, opts, tmp_path / "autotune.json")
    return tmp_path


def sections(text: str) -> set[str]:
    return set(re.findall(r'<section id="([a-z-]+)">', text))


def test_report_has_every_section_and_embedded_pngs(searched, tmp_path, capsys):
    out, png_dir = tmp_path / "report.html", tmp_path / "png"
    code = cli.main(["report", str(searched / "autotune.json"), "--output", str(out), "--png", str(png_dir)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "optuna-dashboard sqlite:///" in printed
    text = out.read_text()
    assert sections(text) == set(SECTIONS)
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 5  # history, by-workers, memory, finalists, cold-warm
    assert all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)
    assert "http://" not in text and "https://" not in text  # nothing to fetch when viewed
    pngs = sorted(p.name for p in png_dir.iterdir())
    assert pngs == sorted(["history.png", "epoch_by_workers_and_cache.png", "memory_by_workers.png",
                           "finalists.png", "cold_vs_warm_epoch.png"])
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in png_dir.iterdir())
    assert "Not available" not in text


def test_trials_come_from_the_study_the_recipe_names(searched):
    data = json.loads((searched / "autotune.json").read_text())
    (profile,) = data["profiles"].values()
    rows, note = load_trials(profile["measured"]["study"])
    assert rows and note == ""
    done = [r for r in rows if r.state == "COMPLETE" and not r.repeat]
    assert done and all(r.measurement is not None and r.measurement.epochs for r in done)  # typed figures read back
    assert any(r.config.get("num_workers") == 0 for r in done)


def test_without_the_study_the_report_uses_the_recipe_alone(searched, tmp_path):
    data = json.loads((searched / "autotune.json").read_text())
    for profile in data["profiles"].values():
        profile["measured"]["study"]["storage"] = f"sqlite:///{tmp_path / 'moved' / 'studies.db'}"
    moved = tmp_path / "autotune.json"
    moved.write_text(json.dumps(data))
    result = build_report(moved, tmp_path / "report.html")
    assert not result.study_opened
    assert not (tmp_path / "moved").exists(), "opening the study must not create an empty database"
    text = (tmp_path / "report.html").read_text()
    assert sections(text) == set(SECTIONS)
    assert "could not be opened" in text and "recipe file alone" in text
    assert text.count("data:image/png;base64,") == 2  # finalists and cold-warm come from the recipe
    assert result.dashboard_command and "optuna-dashboard" in result.dashboard_command


def test_missing_recipe_is_one_line_exit_2(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "No recipe file" in err and len(err.splitlines()) == 1
