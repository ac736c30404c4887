"""Same seed, same batches: the factory's loaders yield a plain DataLoader's batches epoch for epoch, whatever
their workers and persistence, and consume the generator (or torch's global one) exactly as it does."""

from __future__ import annotations

import pytest
import torch
from test_factory import write_recipe
from torch.utils.data import DataLoader, DistributedSampler
from workloads import Numbers, take

import autotune
from autotune.config import LoaderConfig

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("closes_loaders")]

CONFIGS = {
    "no workers": LoaderConfig(),
    "2 workers": LoaderConfig(num_workers=2, multiprocessing_context="fork"),
    "2 persistent workers": LoaderConfig(num_workers=2, prefetch_factor=4, persistent_workers=True,
                                         multiprocessing_context="fork"),
}
EPOCHS = 4


def epochs(loader, n=EPOCHS, set_epoch=None):
    out = []
    for epoch in range(n):
        if set_epoch is not None:
            set_epoch(epoch)
        out.append([batch[1].tolist() for batch in loader])
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_shuffled_batches_are_a_plain_loaders_for_the_same_generator(tmp_path, name):
    path = write_recipe(tmp_path / "autotune.json", config=CONFIGS[name])
    dataset = Numbers(37)
    tuned_gen, plain_gen = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    tuned = autotune.dataloader(dataset, path, shuffle=True, generator=tuned_gen)
    plain = DataLoader(dataset, batch_size=8, shuffle=True, generator=plain_gen)
    assert tuned.num_workers == CONFIGS[name].num_workers
    got, want = epochs(tuned), epochs(plain)
    assert got == want
    assert len({str(e) for e in want}) == EPOCHS  # every epoch its own order
    assert torch.equal(tuned_gen.get_state(), plain_gen.get_state())  # and the generator left where it leaves it


@pytest.mark.parametrize("name", CONFIGS)
def test_without_a_generator_torchs_global_one_is_consumed_as_a_plain_loader_does(tmp_path, name):
    path = write_recipe(tmp_path / "autotune.json", config=CONFIGS[name])
    dataset = Numbers(21)
    torch.manual_seed(3)
    got = epochs(autotune.dataloader(dataset, path, shuffle=True), 3)
    after = torch.randint(1 << 30, (1,)).item()
    torch.manual_seed(3)
    want = epochs(DataLoader(dataset, batch_size=8, shuffle=True), 3)
    assert (got, after) == (want, torch.randint(1 << 30, (1,)).item())


@pytest.mark.parametrize("name", CONFIGS)
def test_a_distributed_sampler_is_left_to_its_epochs(tmp_path, name):
    path = write_recipe(tmp_path / "autotune.json", config=CONFIGS[name])
    dataset = Numbers(30)
    samplers = [DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=5) for _ in range(2)]
    gens = [torch.Generator().manual_seed(1) for _ in range(2)]
    tuned = autotune.dataloader(dataset, path, sampler=samplers[0], generator=gens[0], drop_last=True)
    plain = DataLoader(dataset, batch_size=8, sampler=samplers[1], generator=gens[1], drop_last=True)
    assert tuned.sampler is samplers[0]
    assert epochs(tuned, 3, samplers[0].set_epoch) == epochs(plain, 3, samplers[1].set_epoch)
    assert torch.equal(gens[0].get_state(), gens[1].get_state())


def test_a_user_sampler_and_batch_sampler_pass_through_untouched(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=CONFIGS["2 persistent workers"])
    dataset = Numbers(20)
    sampler = list(range(19, -1, -1))
    loader = autotune.dataloader(dataset, path, sampler=sampler)
    assert loader.sampler is sampler
    assert epochs(loader, 2) == [[list(range(19, 11, -1)), list(range(11, 3, -1)), [3, 2, 1, 0]]] * 2
    batches = [[3, 1], [0], [2, 4]]
    loader = autotune.dataloader(dataset, path, batch_sampler=batches)
    assert loader.batch_sampler is batches and epochs(loader, 2) == [batches, batches]


@pytest.mark.parametrize("name", CONFIGS)
def test_a_stateful_dataloader_of_any_workers_yields_a_plain_loaders_batches(tmp_path, name):
    """StatefulDataLoader's own samplers draw as its iterator is made, which its multi-worker iterator does
    twice: its order depends on num_workers. The factory owns its index stream."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = write_recipe(tmp_path / "autotune.json", config=CONFIGS[name])
    dataset = Numbers(37)
    tuned_gen, plain_gen = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    tuned = autotune.dataloader(dataset, path, shuffle=True, generator=tuned_gen, loader_cls=StatefulDataLoader)
    assert isinstance(tuned, StatefulDataLoader) and len(tuned) == 5
    plain = DataLoader(dataset, batch_size=8, shuffle=True, generator=plain_gen)
    assert epochs(tuned) == epochs(plain)
    assert torch.equal(tuned_gen.get_state(), plain_gen.get_state())
    torch.manual_seed(4)
    got = epochs(autotune.dataloader(dataset, path, shuffle=True, loader_cls=StatefulDataLoader), 2)
    torch.manual_seed(4)
    assert got == epochs(DataLoader(dataset, batch_size=8, shuffle=True), 2)


@pytest.mark.parametrize("loader_cls", ["DataLoader", "StatefulDataLoader"])
def test_a_sampler_with_shuffle_is_refused_as_a_plain_loader_refuses_it(tmp_path, loader_cls):
    from torchdata.stateful_dataloader import StatefulDataLoader

    cls = {"DataLoader": DataLoader, "StatefulDataLoader": StatefulDataLoader}[loader_cls]
    path = write_recipe(tmp_path / "autotune.json", config=CONFIGS["2 workers"])
    dataset = Numbers(10)
    with pytest.raises(ValueError) as plain:
        cls(dataset, sampler=list(range(10)), shuffle=True)
    with pytest.raises(ValueError) as tuned:
        autotune.dataloader(dataset, path, sampler=list(range(10)), shuffle=True, loader_cls=cls)
    assert str(tuned.value) == str(plain.value)


def _shuffled(kind, dataset, seed):
    """The caller's shuffling: ``shuffle=True`` with a generator, or a RandomSampler with its own."""
    from torch.utils.data import RandomSampler

    if kind == "shuffle":
        return {"shuffle": True, "generator": torch.Generator().manual_seed(seed)}
    return {"sampler": RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))}


def _resumable(tmp_path, kind, name, adapt):
    """The plain loader's four epochs, and a maker of the factory's StatefulDataLoader seeded as it is."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = write_recipe(tmp_path / "autotune.json", config=CONFIGS[name])
    dataset = Numbers(37)
    want = epochs(DataLoader(dataset, batch_size=8, **_shuffled(kind, dataset, 5)), 4)

    def make():
        return autotune.dataloader(dataset, path, loader_cls=StatefulDataLoader, adapt=adapt,
                                   **_shuffled(kind, dataset, 5))

    return want, make


@pytest.mark.parametrize("kind", ["shuffle", "own sampler"])
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("saved", ["mid-epoch", "at the last batch", "between epochs"])
@pytest.mark.parametrize("adapt", [False, True])
def test_a_stateful_dataloader_resumed_in_a_fresh_loader_yields_the_plain_loaders_rest(tmp_path, kind, name, saved,
                                                                                    adapt):
    """A checkpoint in epoch 2 (after its 2nd batch, after its last before the loop ended, or once the loop
    ended) loaded into a fresh loader whose generator is seeded as the first was: the rest of the epoch, then
    the next epochs, exactly as the plain loader yields them (StatefulDataLoader primes a finished state's
    iterator before it makes the next epoch's: the next epoch is drawn once); fixed, or adapting from the
    recipe's configuration to whatever its policy tries."""
    want, make = _resumable(tmp_path, kind, name, adapt)
    loader = make()
    assert epochs(loader, 1) == want[:1]
    at = {"mid-epoch": 2, "at the last batch": 5, "between epochs": None}[saved]
    got = take(loader, at)
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = epochs(resumed, 3 if at else 2)
    if saved == "between epochs":
        assert rest == want[2:]
    else:
        assert got == want[1][:at] and rest == [want[1][at:], *want[2:]]


@pytest.mark.parametrize("kind", ["shuffle", "own sampler"])
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("saved", ["mid-epoch", "between epochs"])
@pytest.mark.parametrize("adapt", [False, True])
def test_a_checkpoint_taken_right_after_a_resume_resumes_the_same_rest(tmp_path, kind, name, saved, adapt):
    """A state saved before the first batch after ``load_state_dict`` (a training loop that checkpoints as
    it resumes) is the loaded one: the resumed loader goes on with the saved epoch's rest, and a fresh loader
    resumed from the second state yields the same (the epoch's start stays the loaded one, not where the
    fresh generators are; an adapting loader does not take the loaded epoch for a finished one)."""
    want, make = _resumable(tmp_path, kind, name, adapt)
    loader = make()
    epochs(loader, 1)
    at = 2 if saved == "mid-epoch" else None
    take(loader, at)
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    again = resumed.state_dict()
    fresh = make()
    fresh.load_state_dict(again)
    rest = [want[1][at:], *want[2:]] if at else want[2:]
    assert epochs(resumed, len(rest)) == rest
    assert epochs(fresh, len(rest)) == rest


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("adapt", [False, True])
def test_a_stateful_distributed_sampler_resumed_in_a_later_epoch_yields_its_rest(tmp_path, name, adapt):
    """torchdata's StatefulDistributedSampler keeps where its next ``__iter__`` resumes, not where its epoch
    began: it is left to the loader class, which asks it at each batch, as a plain loader does (recorded at
    an epoch's start, it named the epoch before's end, and a resume in epoch 2 skipped the whole epoch)."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    path = write_recipe(tmp_path / "autotune.json", config=CONFIGS[name], batch_size=4)
    dataset = Numbers(30)

    def sampler():
        return StatefulDistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=5)

    plain = sampler()
    want = epochs(DataLoader(dataset, batch_size=4, sampler=plain), 3, plain.set_epoch)
    first = sampler()
    loader = autotune.dataloader(dataset, path, sampler=first, loader_cls=StatefulDataLoader, adapt=adapt)
    assert epochs(loader, 1, first.set_epoch) == want[:1]
    first.set_epoch(1)
    got = take(loader, 2)
    state = loader.state_dict()
    second = sampler()
    resumed = autotune.dataloader(dataset, path, sampler=second, loader_cls=StatefulDataLoader, adapt=adapt)
    resumed.load_state_dict(state)
    second.set_epoch(1)
    rest = [batch[1].tolist() for batch in resumed]
    assert got == want[1][:2] and rest == want[1][2:]
    assert epochs(resumed, 1, lambda _: second.set_epoch(2)) == want[2:]


class Backwards(torch.utils.data.Sampler):
    """A sampler without ``__len__``: a plain loader iterates it and has no length."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("adapt", [False, True])
def test_a_sampler_without_a_length_yields_a_plain_loaders_batches_and_resumes(tmp_path, name, adapt):
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = write_recipe(tmp_path / "autotune.json", config=CONFIGS[name])
    dataset = Numbers(20)
    want = epochs(DataLoader(dataset, batch_size=8, sampler=Backwards(20)), 3)
    assert epochs(autotune.dataloader(dataset, path, sampler=Backwards(20), adapt=adapt), 3) == want

    def make():
        return autotune.dataloader(dataset, path, sampler=Backwards(20), loader_cls=StatefulDataLoader, adapt=adapt)

    loader = make()
    assert epochs(loader, 1) == want[:1]
    take(loader, 1)
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert epochs(resumed, 2) == [want[1][1:], want[2]]
