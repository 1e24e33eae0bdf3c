"""Your own model in dpcore: a function that returns a ``dpcore.Workload``.

# From the repository root (or from examples/ with `--model my_model:build`):
#   python -m dpcore verify --model examples.my_model:build --world-size 2
#   python -m dpcore profile --model examples.my_model:build --variants flat,bucketed,torch_ddp --world-sizes 1,2

The model has what a data-parallel implementation must get right: a tied weight (the
embedding is also the output head), a frozen parameter, and two inputs (tokens and features).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import dpcore

VOCAB, DIM, FEATURES, CONTEXT = 50, 16, 5, 8


class TwoInputModel(nn.Module):
    """Tokens and a feature vector in, next-token logits out."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.features = nn.Linear(FEATURES, DIM)
        self.bias = nn.Parameter(torch.randn(DIM) * 0.1, requires_grad=False)  # frozen
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied: one Parameter, used twice

    def forward(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens).mean(dim=1) + self.features(feats) + self.bias
        return self.head(torch.tanh(self.mix(h)))


def make_batch(batch_size: int, g: torch.Generator) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Random data, drawn only from ``g`` so that every rank sees the same global batch."""
    tokens = torch.randint(0, VOCAB, (batch_size, CONTEXT), generator=g)
    feats = torch.randn(batch_size, FEATURES, generator=g)
    targets = torch.randint(0, VOCAB, (batch_size,), generator=g)
    return (tokens, feats), targets


def build() -> dpcore.Workload:
    # cross_entropy averages over the batch: the mean is what makes DP's averaged gradient exact
    return dpcore.Workload(TwoInputModel(), make_batch, F.cross_entropy, batch_size=16)
