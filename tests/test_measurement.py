"""A trial's result as one typed, frozen object: its one JSON form round-trips exactly, refuses unknown keys
and wrong types with a message naming them, reads what an older version stored, and combines ranks and runs
exactly (in memory, no trial process)."""

from __future__ import annotations

import json
from dataclasses import replace

import optuna
import pytest

from autotune.config import LoaderConfig
from autotune.errors import AutotuneError, MeasurementError
from autotune.machine._evict import EvictionReport
from autotune.tuner._measurement import Measurement
from autotune.tuner._predict import EpochTiming, Prediction
from autotune.tuner._study import _RUNS_PREFIX, _pooled_runs


def _prediction(total: float) -> Prediction:
    return Prediction(build_seconds=0.5, first_epoch_seconds=total / 2, epoch_seconds=total / 4,
                      total_seconds=total, epochs=3, extrapolated=True, build_fixed_seconds=0.125)


def _full(total: float = 6.0, memory: int = 1000, samples: int = 64) -> Measurement:
    return Measurement(
        prediction=_prediction(total),
        epochs=(EpochTiming(seconds=1.5, first_batch=0.25, batches=4), EpochTiming(0.75, 0.0625, 4, 0.125)),
        measured_samples=samples, peak_memory_bytes=memory, build_seconds_subset=0.375,
        eviction=EvictionReport(files=3, bytes=4096, resident_before=1.0, resident_after=0.0, effective=True,
                                note="", failed=("/data/x: Permission denied",)),
        process_applied=("glibc-tuned (mallopt) in the main process",), process_not_applied=("jemalloc: no",),
        ranks=(5.0, 6.0), runs=(6.0,), cache_origins=("built", "waited"), cache_builders=("1f2e", "1f2e"),
    )


def _plain(total: float, memory: int = 1000, samples: int = 8) -> Measurement:
    return Measurement(prediction=_prediction(total), epochs=(), measured_samples=samples, peak_memory_bytes=memory)


@pytest.mark.parametrize("m", [_full(), _plain(2.0)], ids=["every field", "defaults"])
def test_the_json_form_round_trips_exactly_through_json_text(m):
    data = m.to_json()
    assert Measurement.from_json(data) == m
    assert Measurement.from_json(json.loads(json.dumps(data))) == m
    assert json.loads(json.dumps(data)) == data  # JSON-native: a stored copy compares equal to a fresh one


def test_the_json_form_keeps_the_keys_an_older_study_holds():
    data = _full().to_json()
    assert set(data) == {"prediction", "epochs", "measured_samples", "peak_memory_bytes", "added_memory_bytes",
                         "build_seconds_subset",
                         "eviction", "process_applied", "process_not_applied", "ranks", "runs", "cache_origins",
                         "cache_builders"}
    assert data["prediction"] == _prediction(6.0).to_dict()
    assert data["epochs"][1] == {"seconds": 0.75, "first_batch": 0.0625, "batches": 4, "head_seconds": 0.125}


def test_an_older_trials_four_attributes_read_with_defaults_for_the_rest():
    attrs = {"config": LoaderConfig().to_json(), "config_key": LoaderConfig().key(), "log": "trial-0.log",
             "prediction": {k: v for k, v in _prediction(4.0).to_dict().items() if k != "build_fixed_seconds"},
             "epochs": [{"seconds": 1.0, "first_batch": 0.5, "batches": 2}], "peak_memory_bytes": 7,
             "measured_samples": 16}
    m = Measurement.from_trial_attrs(attrs)
    assert m == Measurement(prediction=replace(_prediction(4.0), build_fixed_seconds=0.0),
                            epochs=(EpochTiming(1.0, 0.5, 2),), measured_samples=16, peak_memory_bytes=7)
    assert m.build_seconds_subset is None and m.eviction is None and m.runs == () and m.ranks == ()
    assert Measurement.from_trial_attrs({"config": {}, "reason": "timed out"}) is None  # a failed trial


@pytest.mark.parametrize("change, message", [
    ({"speed": 1}, "a trial result has unknown keys 'speed'"),
    ({"measured_samples": "64"}, "a trial result's measured_samples must be an integer, but got '64'"),
    ({"measured_samples": True}, "a trial result's measured_samples must be an integer, but got True"),
    ({"peak_memory_bytes": 1.5}, "a trial result's peak_memory_bytes must be an integer, but got 1.5"),
    ({"prediction": {**_prediction(1.0).to_dict(), "total_seconds": "fast"}},
     "a trial result's prediction.total_seconds must be a number, but got 'fast'"),
    ({"prediction": {**_prediction(1.0).to_dict(), "extra": 0}}, "a trial result's prediction has unknown keys 'extra'"),
    ({"prediction": [1.0]}, "a trial result's prediction must be an object, but got list"),
    ({"epochs": {"seconds": 1.0}}, "a trial result's epochs must be a list, but got {'seconds': 1.0}"),
    ({"epochs": [{"seconds": 1.0}]}, "a trial result's epochs[0] lacks 'first_batch', 'batches'"),
    ({"eviction": {**_full().to_json()["eviction"], "effective": "yes"}},
     "a trial result's eviction.effective must be true or false, but got 'yes'"),
    ({"process_applied": ["ok", 3]}, "a trial result's process_applied[1] must be a string, but got 3"),
    ({"runs": [1.0, None]}, "a trial result's runs[1] must be a number, but got None"),
])
def test_unknown_keys_and_wrong_types_are_refused_with_the_message(change, message):
    with pytest.raises(MeasurementError) as raised:
        Measurement.from_json({**_full().to_json(), **change})
    assert str(raised.value) == message
    assert isinstance(raised.value, AutotuneError)  # the CLI prints it as one line, exit 2


def test_a_result_that_is_no_object_or_lacks_a_figure_is_refused():
    with pytest.raises(MeasurementError, match="^a trial result must be an object, but got list$"):
        Measurement.from_json([])
    data = _plain(1.0).to_json()
    del data["peak_memory_bytes"]
    with pytest.raises(MeasurementError, match="^a trial result lacks 'peak_memory_bytes'$"):
        Measurement.from_json(data)


def test_the_median_is_the_median_run_with_the_peak_memory_of_all():
    runs = [_full(3.0, 10), _full(1.0, 30), _full(2.0, 20), _full(4.0, 5)]
    # an even count: the two middle runs' predictions averaged, the rest the lower one's
    middle = Prediction(build_seconds=0.5, first_epoch_seconds=1.25, epoch_seconds=0.625, total_seconds=2.5,
                        epochs=3, extrapolated=True, build_fixed_seconds=0.125)
    assert Measurement.median(runs) == replace(_full(2.0, 20), prediction=middle, peak_memory_bytes=30,
                                               runs=(3.0, 1.0, 2.0, 4.0))
    two = Measurement.median([_plain(3.25), _plain(2.5)])
    assert two.total_seconds == 2.875 and two.runs == (3.25, 2.5)
    odd = Measurement.median([_plain(3.0, 1), _plain(1.0, 2), _plain(2.0, 3)])
    assert odd.total_seconds == 2.0 and odd.peak_memory_bytes == 3 and odd.runs == (3.0, 1.0, 2.0)
    assert Measurement.median([_plain(5.0)]).runs == (5.0,)


def test_ranks_combine_as_the_slowest_with_memory_and_samples_summed():
    ranks = [_plain(2.0, 100, 8), _plain(3.5, 50, 8), _plain(3.0, 25, 7)]
    assert Measurement.slowest_rank(ranks) == Measurement(prediction=_prediction(3.5), epochs=(), measured_samples=23,
                                                          peak_memory_bytes=175, ranks=(2.0, 3.5, 3.0))
    one = _plain(2.0)
    assert Measurement.slowest_rank([one]) is one  # a single rank is its own figure, no ranks recorded


def test_a_study_pooling_runs_this_version_cannot_read_names_them():
    study = optuna.create_study(study_name="s")
    key = LoaderConfig().key()
    study.set_user_attr(f"{_RUNS_PREFIX}a", {key: [_plain(2.0).to_json()]})
    assert _pooled_runs(study) == {LoaderConfig(): [_plain(2.0)]}
    study.set_user_attr(f"{_RUNS_PREFIX}b", {key: [{**_plain(2.0).to_json(), "measured_samples": "all"}]})
    message = f"'{_RUNS_PREFIX}b' of the study s: a trial result's measured_samples must be an integer, but got 'all'"
    with pytest.raises(MeasurementError) as raised:
        _pooled_runs(study)  # --resume-only: nothing spent yet, so the error stops it
    assert str(raised.value) == message
    notes: list[str] = []  # after a search has spent its budget: that source is left out, with a note
    assert _pooled_runs(study, unreadable=notes) == {LoaderConfig(): [_plain(2.0)]}
    assert notes == [f"ignored {message}"]
    study.set_user_attr(f"{_RUNS_PREFIX}c", [1, 2])
    notes.clear()
    assert _pooled_runs(study, unreadable=notes) == {LoaderConfig(): [_plain(2.0)]}
    assert notes[1] == (f"ignored '{_RUNS_PREFIX}c' of the study s: finalist runs must be an object of lists, "
                        "by configuration")
