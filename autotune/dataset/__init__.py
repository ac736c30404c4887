"""The user's dataset: the file that declares it, and what is learnt of it before any candidate runs.

``_userfile`` imports ``PATH[:NAME]`` and its hooks (``_datamodule`` reads a LightningDataModule);
``_probe`` reads a few samples (cost, size); ``_determinism`` and ``_statefulness`` decide which caches
and which persistent workers are safe; ``_stream`` knows streams and their shards; ``_fingerprint`` is
the dataset's identity; ``_floor`` is this machine's floor for a run over it (one bare decode pass,
then batch gathers from memory).  See docs/architecture.md.
"""

from autotune.dataset._datamodule import Resolved, is_datamodule, resolve_datamodule, resolving
from autotune.dataset._determinism import check_deterministic
from autotune.dataset._fingerprint import dataset_fingerprint
from autotune.dataset._floor import (
    Floor,
    GatherEpochs,
    bare_decode,
    decode_once,
    epoch_gathers,
    measure_floor,
    rows_in_memory,
)
from autotune.dataset._probe import Probe, probe_dataset, probe_stream, time_step
from autotune.dataset._statefulness import epoch_state_warning
from autotune.dataset._stream import (
    check_sharding,
    first_samples,
    is_stream,
    local_shard_files,
    sample_key,
    shard_count,
    stream_length,
)
from autotune.dataset._userfile import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EPOCHS,
    UserSpec,
    check_dataset,
    import_file,
    load_user_file,
    read_sample,
    require_map_style,
)
from autotune.dataset._watchdog import guarded, reading

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_EPOCHS",
    "Floor",
    "GatherEpochs",
    "Probe",
    "Resolved",
    "UserSpec",
    "bare_decode",
    "check_dataset",
    "check_deterministic",
    "check_sharding",
    "dataset_fingerprint",
    "decode_once",
    "epoch_gathers",
    "epoch_state_warning",
    "first_samples",
    "guarded",
    "import_file",
    "is_datamodule",
    "is_stream",
    "load_user_file",
    "measure_floor",
    "local_shard_files",
    "probe_dataset",
    "probe_stream",
    "read_sample",
    "reading",
    "require_map_style",
    "resolve_datamodule",
    "resolving",
    "rows_in_memory",
    "sample_key",
    "shard_count",
    "stream_length",
    "time_step",
]
