"""What a search measures honestly: cold first epochs, /dev/shm, per-epoch state."""

from __future__ import annotations

import optuna
import pytest
from evict_workloads import ColdnessLog, FileSamples, page_cache_is_droppable, write_files
from workloads import FourMegabyteBatches, WithEpochs

from autotune._api import search_spec
from autotune.config import LoaderConfig
from autotune.dataset._userfile import UserSpec
from autotune.tuner import _preparation as preparation
from autotune.tuner._measure import Plan, Workload, measure
from autotune.tuner._study import SearchOptions

pytestmark = pytest.mark.timeout(240)


def spec_for(dataset, epochs=2):
    return UserSpec(dataset=dataset, source=f"<python object: {type(dataset).__name__}>", batch_size=8, epochs=epochs)


def opts(tmp_path, budget, **kw):
    kw.setdefault("allocators", ("glibc",))
    kw.setdefault("max_rounds", 2)  # the fewest finalist rounds: no test here reads the interval they narrow
    kw.setdefault("caches", ("none",))
    return SearchOptions(budget=budget, workdir=tmp_path / ".autotune", progress=False, **kw)


def trials(outcome):
    return optuna.load_study(study_name=outcome.study["name"], storage=outcome.study["storage"]).trials


def test_source_files_are_evicted_before_the_first_epoch(tmp_path):
    if not page_cache_is_droppable(tmp_path):
        pytest.skip("the temporary folder is on tmpfs, where eviction cannot drop pages")
    paths = write_files(tmp_path / "data", 32, 64 << 10)
    _, outcome = search_spec(spec_for(FileSamples(paths)), opts(tmp_path, 8, max_workers=0), None)
    assert any(n.startswith("cold reads: 32 source file(s) (path list") for n in outcome.notes)
    measured = [t for t in trials(outcome) if t.state == optuna.trial.TrialState.COMPLETE]
    assert measured
    # The trial records the eviction it made; its figures come from the cold read that followed.
    eviction = outcome.figures.eviction
    assert eviction is not None and eviction.files == 32 and eviction.effective
    assert eviction.resident_after is not None and eviction.resident_after <= 0.05


def test_the_subset_build_reads_cold_files_after_its_head_build(tmp_path):
    # A trial first builds 16 samples (to split the build's start-up from its per-sample cost), then the
    # subset, which starts with those 16: their files must be cold again, as in the factory's one build.
    if not page_cache_is_droppable(tmp_path):
        pytest.skip("the temporary folder is on tmpfs, where eviction cannot drop pages")
    paths = write_files(tmp_path / "data", 120, 64 << 10)
    log = tmp_path / "reads.log"
    plan = Plan(indices=list(range(80)), length=120, files=tuple(paths), sample_memory=False)
    measure(Workload(dataset=ColdnessLog(paths, log), batch_size=8, epochs=2), LoaderConfig(cache="memory"), plan)
    reads = log.read_text().split()
    subset_build = list(zip(reads[0::2], reads[1::2]))[-80:]  # the epochs read the cache, not the files
    assert [int(i) for i, _ in subset_build] == list(range(80))
    assert [i for i, state in subset_build if state == "warm"] == []


def test_generated_data_is_measured_warm_and_says_so(tmp_path):
    _, outcome = search_spec(spec_for(WithEpochs(16)), opts(tmp_path, 6, max_workers=0), None)
    assert any("no source files to evict" in n for n in outcome.notes)


def test_stateful_datasets_never_get_persistent_workers(tmp_path):
    _, outcome = search_spec(spec_for(WithEpochs(32)), opts(tmp_path, 12), None)
    assert any("per-epoch state" in n and "set_epoch" in n for n in outcome.notes)
    assert all(not t.user_attrs.get("config", {}).get("persistent_workers") for t in trials(outcome))


def test_a_small_dev_shm_rules_worker_candidates_out(tmp_path, monkeypatch):
    # The free space of /dev/shm is this machine's configuration, read once before the search.
    monkeypatch.setattr(preparation, "shm_free", lambda: 8 << 20)
    recipe, outcome = search_spec(spec_for(FourMegabyteBatches(32)), opts(tmp_path, 300, max_trials=3), None)
    ruled_out = [t.user_attrs["reason"] for t in trials(outcome) if t.state == optuna.trial.TrialState.FAIL]
    assert ruled_out and all("of /dev/shm" in r and "bus error" in r for r in ruled_out)
    assert any(n.startswith("/dev/shm limits this machine") for n in outcome.notes)
    assert recipe.config.num_workers == 0
