"""The model and the synthetic data that :mod:`smdccl.bench.ddp` trains.

A small decoder-only transformer (token embedding, learned positions,
pre-norm ``nn.TransformerEncoderLayer`` blocks with a causal mask, untied
output head) trained on next-token prediction. The data is synthetic but
learnable: each sequence follows a fixed random permutation of the vocabulary
(``x[t+1] = perm[x[t]]``) with probability 0.9, and a uniformly random token
otherwise, so the loss falls from ln(vocab) towards the noise floor within a
few dozen steps and configurations can be compared on it.

Everything is seeded: the initial weights by ``seed``, the permutation by
``seed``, each batch by (seed, rank, step), so every configuration of one run
trains on exactly the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

#: name -> (vocab, d_model, heads, ff, layers, seq, batch)
SIZES = {
    # ~4.2 M parameters, 16.8 MB of float32 gradients: several 4 MB buckets
    "small": dict(vocab=2048, d_model=256, heads=4, ff=1024, layers=4, seq=64, batch=4),
    # ~0.1 M parameters: for tests
    "tiny": dict(vocab=256, d_model=64, heads=2, ff=128, layers=2, seq=16, batch=4),
}


@dataclass(frozen=True)
class Spec:
    vocab: int
    d_model: int
    heads: int
    ff: int
    layers: int
    seq: int
    batch: int

    @classmethod
    def named(cls, name: str) -> "Spec":
        return cls(**SIZES[name])


class TinyGPT(nn.Module):
    def __init__(self, spec: Spec):
        super().__init__()
        self.embed = nn.Embedding(spec.vocab, spec.d_model)
        self.pos = nn.Parameter(torch.zeros(spec.seq, spec.d_model))
        layer = nn.TransformerEncoderLayer(spec.d_model, spec.heads, spec.ff, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, spec.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(spec.d_model)
        self.head = nn.Linear(spec.d_model, spec.vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(spec.seq),
                             persistent=False)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = self.blocks(h, mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return self.head(self.norm(h))


def build(spec: Spec, seed: int) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(spec)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Data:
    """Per-rank batches: ``batch(rank, step)`` -> (inputs, targets), deterministic."""

    def __init__(self, spec: Spec, seed: int):
        self.spec = spec
        self.seed = seed
        g = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(spec.vocab, generator=g)

    def batch(self, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.spec
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + rank * 10_007 + step)
        tokens = torch.empty(s.batch, s.seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(s.vocab, (s.batch,), generator=g)
        noise = torch.rand(s.batch, s.seq, generator=g) < 0.1
        random = torch.randint(s.vocab, (s.batch, s.seq), generator=g)
        for t in range(s.seq):
            tokens[:, t + 1] = torch.where(noise[:, t], random[:, t], self.perm[tokens[:, t]])
        return tokens[:, :-1], tokens[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def initial_loss(spec: Spec) -> float:
    """ln(vocab): the loss of a uniform prediction."""
    return math.log(spec.vocab)
