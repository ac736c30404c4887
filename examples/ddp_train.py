"""Data-parallel training on CPU with torchrun, each rank's DataLoader built from the recipe.

Tune for two ranks per node, then train with two ranks:

    autotune search examples/ddp_train.py --ranks-per-node 2
    torchrun --nproc-per-node 2 examples/ddp_train.py

Every rank calls ``autotune.dataloader``: the profile is found under (this machine, LOCAL_WORLD_SIZE ranks
per node), so no rank warns about other hardware. The ``DistributedSampler`` passes through untouched.
``AUTOTUNE_RECIPE`` names the recipe (default autotune.json); with ``AUTOTUNE_REPORT`` (a path with
``{rank}`` in it) each rank also runs ``autotune check`` and writes what it found there as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

batch_size = 16
epochs = 2


class Features(Dataset):
    """Fixed random features and a linear target, with a little decoding work per sample."""

    def __init__(self, n: int = 512, dim: int = 32):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=generator)
        self.w = torch.randn(dim, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        x = self.x[i]
        for _ in range(20):  # stands in for decoding
            x = torch.tanh(x) * 1.0001
        return x, x @ self.w


dataset = Features()


def main() -> int:
    import autotune

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe_path = os.environ.get("AUTOTUNE_RECIPE", "autotune.json")
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = autotune.dataloader(dataset, recipe_path, sampler=sampler, batch_size=batch_size)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(dataset.x.shape[1], 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
    report = os.environ.get("AUTOTUNE_REPORT")
    if report:
        check = subprocess.run([sys.executable, "-m", "autotune", "check", recipe_path], capture_output=True, text=True)
        recipe = autotune.load(recipe_path)
        with open(report.format(rank=rank), "w") as f:
            json.dump({"rank": rank, "steps": steps, "loss": float(loss), "check_exit": check.returncode,
                       "check": check.stdout.strip(), "matches_this_machine": recipe.matches_this_machine,
                       "num_workers": loader.num_workers}, f)
    if rank == 0:
        print(f"{world} ranks: {steps} steps per rank, final loss {float(loss):.4f}, num_workers={loader.num_workers}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
