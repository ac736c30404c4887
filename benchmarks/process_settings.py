"""Issue 7's comparison: what the allocator knob is worth to a tuned recipe, and which allocator the tuner
picks on each of the allocation-heavy paths.

Part 1, the three loading paths, each searched with the loader held to that path: (a) decode
JPEGs with ``num_workers=0``; (b) in-memory float tensors with ``num_workers=0``; (c) the same with up to
2 workers. The search's own interleaved finalists give the picked recipe's figure against the default.

Part 2, the article's experiment (2000 JPEGs, batch 64, 3 epochs, first cold, build included): the recipe
searched with every allocator against the recipe searched with glibc's defaults only, each run for real
in a fresh process (with its preload, where it has one), interleaved, medians of ``--repeats``.

    python benchmarks/process_settings.py [--budget 60] [--repeats 3] [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import article_table as A  # noqa: E402

NAME = "process_settings"


class InMemoryTensors(torch.utils.data.Dataset):
    """``count`` float32 3x224x224 tensors held in memory, as after decoding once.

    Made again from a seed when unpickled, so a trial process receives a few bytes instead of 1.2 GB and
    rebuilds them before any measurement starts."""

    def __init__(self, count: int):
        self.count = count
        self.images = torch.rand(count, 3, 224, 224, generator=torch.Generator().manual_seed(0))

    def __getstate__(self):
        return {"count": self.count}

    def __setstate__(self, state):
        self.__init__(state["count"])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        return self.images[i], i % 10


def _spec(dataset, source: str):
    from autotune.dataset._userfile import UserSpec

    return UserSpec(dataset=dataset, source=source, batch_size=A.BATCH, epochs=A.EPOCHS,
                    sys_path=[str(C.EXAMPLES), str(Path(__file__).resolve().parent)])


def paths_part(args, work: Path) -> list[dict]:
    cases = [
        ("decode JPEGs, num_workers=0", lambda: A.jpeg_dataset(args.images), {"max_workers": 0}),
        ("in-memory float tensors, num_workers=0", lambda: InMemoryTensors(args.images), {"max_workers": 0}),
        ("in-memory float tensors, up to 2 workers", lambda: InMemoryTensors(args.images), {"max_workers": 2}),
    ]
    out = []
    for i, (label, make, limits) in enumerate(cases):
        C.say(f"search: {label} ...")
        recipe, outcome, timing = C.autotune_search(_spec(make(), label), budget=args.budget, workdir=work / f"path{i}",
                                                    caches=("none",), **limits)
        m = recipe.measured
        out.append({"path": label, "picked": recipe.config.describe(), "allocator": recipe.config.allocator,
                    "epoch_s": m.chosen.epoch_seconds, "default_epoch_s": m.default.epoch_seconds,
                    "runs_s": list(m.runs_seconds), "default_runs_s": list(m.default_runs_seconds),
                    "search_s": timing["wall_s"]})
        C.say(f"  -> {recipe.config.describe()}: epoch {m.chosen.epoch_seconds:.2f} s vs default "
              f"{m.default.epoch_seconds:.2f} s")
    return out


def article_part(args, work: Path, repeats: int) -> dict:
    spec = _spec(A.jpeg_dataset(args.images), str(C.EXAMPLES / "jpeg_folder.py"))
    profiles, allocators, searches = {}, {}, {}
    for label, allocs in (("with process settings", None), ("glibc defaults only", ("glibc",))):
        C.say(f"search ({label}) ...")
        recipe, _, timing = C.autotune_search(spec, budget=args.budget, workdir=work / label.replace(" ", "-"),
                                              allocators=allocs)
        profiles[label] = recipe.profile.to_dict()
        allocators[label] = recipe.config.allocator
        searches[label] = {"config": recipe.config.describe(), "wall_s": timing["wall_s"]}
        C.say(f"  -> {recipe.config.describe()}")
    script = Path(A.__file__).resolve()

    def runner(label: str, memory: bool = False):
        params = {"images": args.images, "workdir": str(work), "profile": profiles[label]}
        env = C.env_for_allocator(allocators[label])
        return lambda: C.run_fresh(script, "autotune", params, epochs=A.EPOCHS, memory=memory, env=env)

    runs = C.interleaved({label: runner(label) for label in profiles}, repeats, log=C.say)
    return {"searches": searches, "rows": {label: C.summarise_runs(runs[label]) for label in profiles}}


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__, NAME)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--budget", type=float, default=60.0, help="each search's budget, seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.budget = min(args.images, 128), min(args.budget, 8.0)
    repeats = args.repeats or (1 if args.quick else 3)
    work = C.workdir(args.workdir, NAME)
    started = time.perf_counter()
    A.jpeg_dataset(args.images)
    paths = paths_part(args, work)
    article = article_part(args, work, repeats)
    t1 = C.markdown_table(
        ["path", "recipe the tuner picks", "allocator", "epoch, s (tuned)", "epoch, s (default)", "ratio"],
        [[r["path"], r["picked"], r["allocator"], f"{r['epoch_s']:.2f}", f"{r['default_epoch_s']:.2f}",
          f"{r['default_epoch_s'] / r['epoch_s']:.2f}x"] for r in paths])
    rows = article["rows"]
    t2 = C.markdown_table(
        ["recipe", "settings", "epoch 1 (cold), s", "epoch 2, s", "epoch 3, s", "setup / cache build, s", "total, s"],
        [[label, article["searches"][label]["config"], *[C.fmt(e) for e in rows[label].get("epoch_s") or []],
          C.fmt(rows[label].get("setup_s")), C.fmt(rows[label].get("total_s"))] for label in rows])
    print(t1 + "\n\n" + t2)
    path = C.write_json(NAME, {"quick": args.quick, "repeats": repeats, "images": args.images, "budget_s": args.budget,
                               "paths": paths, "article": article, "tables_markdown": [t1, t2],
                               "wall_s": time.perf_counter() - started}, args.output)
    C.say(f"written {path} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
