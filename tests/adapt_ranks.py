"""One rank of the two-rank run in test_adaptive.py (started by torchrun): an adapting loader over a
DistributedSampler; writes what it saw to OUT/rank{N}.json."""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import Numbers  # noqa: E402

import autotune  # noqa: E402


def main(out: str, recipe: str, part_batches: str | None = None) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = Numbers(64, delay=0.004 if rank == 1 else 0.0)  # rank 1 is the slow one
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    loader = autotune.dataloader(dataset, recipe, adapt=True, sampler=sampler, batch_size=4)
    loader.policy.explore_share = 1  # a run this short affords no try under rule 5's budget: the switch is the point
    if part_batches is not None:
        loader.part_batches = int(part_batches)
    configs, seen = [], []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        configs.append(loader.config.to_json())
        seen.append([batch[1].tolist() for batch in loader])
    events = loader.history.events
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"configs": configs, "seen": seen, "decisions": [e.decision for e in events],
                   "seconds_per_batch": [e.seconds_per_batch for e in events],
                   "decided": len(loader.policy.stats),
                   "events": [[e.config.to_json(), e.next_config.to_json(), e.mid_epoch] for e in events]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
