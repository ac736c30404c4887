"""The CPU LSTM case: IMDB-like synthetic reviews, tokenised per access, a small LSTM trained on the CPU.

Each review is generated once from a seeded generator (40-200 words from a 5000-word vocabulary, with
punctuation and capitals, as raw text); ``__getitem__`` tokenises it (lower-case, split on non-letters,
vocabulary lookup) into a LongTensor; ``collate_fn`` pads a batch and keeps the lengths; ``train_step``
runs one Adam step of an embedding + one-layer LSTM + linear classifier. Training competes with loader
workers for the CPUs, which is the point of the case. Run:

    autotune search examples/imdb_lstm.py

``AUTOTUNE_EXAMPLE_REVIEWS`` changes how many reviews the dataset holds (default 2000).
"""

from __future__ import annotations

import os
import re

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

REVIEWS = int(os.environ.get("AUTOTUNE_EXAMPLE_REVIEWS", "2000"))
VOCAB = 5000
EMBED = 32
HIDDEN = 32

batch_size = 32
epochs = 3

_WORDS = [f"w{i:04d}" for i in range(VOCAB)]
_INDEX = {w: i + 2 for i, w in enumerate(_WORDS)}  # 0 = padding, 1 = unknown
_SPLIT = re.compile(r"[^a-z0-9]+")


def _review(seed: int) -> str:
    rng = np.random.default_rng([7, seed])
    n = int(rng.integers(40, 201))
    ids = rng.zipf(1.3, size=n) % VOCAB  # word frequencies roughly as in natural text
    words = [_WORDS[i] for i in ids]
    for k in range(0, n, int(rng.integers(8, 20))):
        words[k] = words[k].capitalize() + rng.choice([",", ".", "!", "?", ";"])
    return " ".join(words)


class SyntheticReviews(Dataset):
    """Raw review texts held in memory (as a loaded CSV would be); tokens made per access."""

    def __init__(self, length: int = REVIEWS):
        self.texts = [_review(i) for i in range(length)]
        self.labels = [i % 2 for i in range(length)]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, idx: int):
        tokens = [_INDEX.get(t, 1) for t in _SPLIT.split(self.texts[idx].lower()) if t]
        return torch.tensor(tokens, dtype=torch.long), self.labels[idx]


def dataset() -> SyntheticReviews:
    return SyntheticReviews()


def collate_fn(batch):
    """Pad the token sequences of a batch to its longest; keep each length and the labels."""
    seqs, labels = zip(*batch)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    padded = nn.utils.rnn.pad_sequence(list(seqs), batch_first=True, padding_value=0)
    return padded, lengths, torch.tensor(labels, dtype=torch.long)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB + 2, EMBED, padding_idx=0)
        self.lstm = nn.LSTM(EMBED, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, 2)

    def forward(self, tokens, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(tokens), lengths, batch_first=True,
                                                   enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)
        return self.head(hidden[-1])


_state: dict = {}


def train_step(batch) -> float:
    """One Adam step of the classifier on ``batch``; the model is built on first use in each process."""
    if not _state:
        torch.manual_seed(0)
        model = Classifier()
        _state["model"] = model
        _state["optimizer"] = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = _state["model"], _state["optimizer"]
    tokens, lengths, labels = batch
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(tokens, lengths), labels)
    loss.backward()
    optimizer.step()
    return loss.item()
