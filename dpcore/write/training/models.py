"""Models, deterministic synthetic data and loss functions for every DP job.

Why synthetic data: the profiler measures the *system* (compute vs communication), not
learning; random batches generated from ``(seed, step)`` are identical in every process, so
each rank can slice its own contiguous shard ``[rank*local:(rank+1)*local]`` of the same
global batch and every variant can be checked against ``single`` on the full batch.

Models (docs/DESIGN.md "Models"):

* ``mlp``: 16 ``Linear`` layers of width ``cfg.width`` with ReLU between them; input dim
  :data:`MLP_IN_DIM` (256), :data:`MLP_CLASSES` (10) classes, cross-entropy loss.
* ``transformer``: a GPT-style pre-LayerNorm decoder, vocab 10000, input embedding tied to the
  output projection (one ``Parameter`` used twice, which DP must reduce *once*). Sizes in
  :data:`TRANSFORMER_SIZES`; ``tiny`` (d=64, ff=256, 2 layers, 4 heads, context 32) keeps a CPU
  step well under a second. Big sizes are only constructed when asked for.
* ``einsum``: two weight matrices, ``h = relu(einsum('bd,df->bf', x, W1))`` then
  ``einsum('bf,fd->bd', h, W2)`` with MSE to a target; d=2048, f=1024. ``b`` is the *global*
  batch (docs/DESIGN.md's 5120 is :data:`EINSUM_BATCH`, see :func:`default_batch_size`); each rank
  computes its ``b/N`` rows, so the total work is fixed and only its split changes.
* ``toy`` (tests / verify): a tied weight (13x7, used as embedding and output head), a frozen
  parameter (``requires_grad=False``), a buffer, and sizes not divisible by 2 or 3.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from dpcore.contract.config import TrainConfig
from dpcore.contract.errors import UsageError, choices_error
from dpcore.contract.limits import (
    EINSUM_D,
    EINSUM_F,
    MLP_CLASSES,
    MLP_IN_DIM,
    MLP_LAYERS,
    TRANSFORMER_SIZES,
    VOCAB,
)

# The shapes (MLP_*, VOCAB, TRANSFORMER_SIZES: size -> (d_model, d_ff, layers, heads,
# context), EINSUM_*) live with the torch-free size estimates that refuse what cannot fit.
MODEL_NAMES = ("mlp", "transformer", "einsum", "toy")
EINSUM_BATCH = 5120
TOY_VOCAB, TOY_DIM, TOY_HIDDEN, TOY_CONTEXT = 13, 7, 11, 3


class MLP(nn.Sequential):
    """16 Linear layers (ReLU between them): many equal-sized gradients, ideal for bucketing."""

    def __init__(self, width: int, layers: int = MLP_LAYERS) -> None:
        dims = [MLP_IN_DIM] + [width] * (layers - 1) + [MLP_CLASSES]
        mods: list[nn.Module] = []
        for i in range(layers):
            mods.append(nn.Linear(dims[i], dims[i + 1]))
            if i < layers - 1:
                mods.append(nn.ReLU())
        super().__init__(*mods)


class Block(nn.Module):
    """Pre-LN transformer block (GPT-2 layout) with causal SDPA attention."""

    def __init__(self, d: int, ff: int, heads: int) -> None:
        super().__init__()
        if d % heads:
            raise UsageError(f"d_model {d} is not divisible by {heads} heads")
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    """GPT-style decoder; ``head.weight is tok.weight`` (tied, as in GPT-2)."""

    def __init__(self, d: int, ff: int, layers: int, heads: int, context: int,
                 vocab: int = VOCAB) -> None:
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, ff, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():  # GPT-2 init keeps the initial loss near log(vocab)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class Einsum(nn.Module):
    """Two weight matrices; the activation is the docs/DESIGN.md 'bd,df->bf' einsum."""

    def __init__(self, d: int = EINSUM_D, f: int = EINSUM_F) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(d, f) / math.sqrt(d))
        self.w2 = nn.Parameter(torch.randn(f, d) / math.sqrt(f))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.einsum("bd,df->bf", x, self.w1))
        return torch.einsum("bf,fd->bd", h, self.w2)


class Toy(nn.Module):
    """Small model with every awkward case a DP implementation must get right.

    * ``emb.weight`` (13x7 = 91 elements) is also ``head.weight``: a tied weight that
      ``parameters()`` yields once; its gradient gets contributions from two uses and must be
      all-reduced exactly once.
    * ``frozen`` (11,) has ``requires_grad=False``: broadcast at construction, never reduced.
    * ``scale`` is a buffer (broadcast at construction).
    * trainable sizes 91, 77, 11, 77, 7 (263 in all, prime): not divisible by 2 or 3, so
      ring chunks and buckets are uneven.
    """

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(TOY_VOCAB, TOY_DIM)
        self.fc1 = nn.Linear(TOY_DIM, TOY_HIDDEN)
        self.frozen = nn.Parameter(torch.randn(TOY_HIDDEN) * 0.1, requires_grad=False)
        self.fc2 = nn.Linear(TOY_HIDDEN, TOY_DIM)
        self.head = nn.Linear(TOY_DIM, TOY_VOCAB, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", 1.0 + 0.1 * torch.rand(TOY_HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.emb(x).mean(dim=1)
        h = torch.tanh(self.fc1(e) + self.frozen) * self.scale
        return self.head(self.fc2(h))


def _check_model(name: str) -> None:
    if name not in MODEL_NAMES:
        raise choices_error("model", name, MODEL_NAMES)


def _construct(cfg: TrainConfig) -> nn.Module:
    if cfg.model == "mlp":
        return MLP(cfg.width)
    if cfg.model == "transformer":
        if cfg.size not in TRANSFORMER_SIZES:
            raise choices_error("size", cfg.size, tuple(TRANSFORMER_SIZES))
        return Transformer(*TRANSFORMER_SIZES[cfg.size])
    if cfg.model == "einsum":
        return Einsum()
    return Toy()


def build_module(cfg: TrainConfig, device: torch.device | str | None = None,
                 seed: int | None = None) -> nn.Module:
    """Build ``cfg.model`` with weights fixed by the seed (``cfg.seed`` unless given).

    Same seed -> identical weights in every process: parameters are drawn on CPU from a forked
    RNG (the caller's RNG state is untouched), then moved to ``device``. Parameters are
    float32 at every ``cfg.dtype``: bf16 and fp16 train under autocast with float32 master
    weights (the trainer's :func:`~dpcore.write.training.precision.autocast`).
    """
    _check_model(cfg.model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed if seed is None else seed)
        model = _construct(cfg)
    return model.to(device=device or "cpu", dtype=torch.float32)


def default_batch_size(model: str) -> int | None:
    """The model's natural *global* batch (einsum: b=5120), or None to use the config's."""
    return EINSUM_BATCH if model == "einsum" else None


def batch_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of step ``step``'s global batch: a pure function of (seed, step), so
    every variant and every rank draws the same data (built-in models and user workloads)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step * 7919 + 17) % (2**63))


def make_batch(cfg: TrainConfig, model_name: str, step: int, global_batch: int,
               seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic CPU batch ``(x, y)`` of ``global_batch`` samples for ``step``.

    Every process calling this with the same arguments gets bit-identical tensors; rank r
    uses rows ``[r*local:(r+1)*local]`` (see :func:`shard`).
    """
    _check_model(model_name)
    g = batch_generator(cfg.seed if seed is None else seed, step)
    dtype = torch.float32  # inputs as the float32 master weights; autocast casts per op
    b = global_batch
    if model_name == "mlp":
        x = torch.randn(b, MLP_IN_DIM, generator=g).to(dtype)
        return x, torch.randint(0, MLP_CLASSES, (b,), generator=g)
    if model_name == "transformer":
        ctx = TRANSFORMER_SIZES[cfg.size][4] if cfg.size in TRANSFORMER_SIZES else 32
        tokens = torch.randint(0, VOCAB, (b, ctx + 1), generator=g)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    if model_name == "einsum":
        x = torch.randn(b, EINSUM_D, generator=g).to(dtype)
        return x, torch.randn(b, EINSUM_D, generator=g).to(dtype)
    x = torch.randint(0, TOY_VOCAB, (b, TOY_CONTEXT), generator=g)
    return x, torch.randint(0, TOY_VOCAB, (b,), generator=g)


def shard(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of a global batch (divisible by ``world_size``)."""
    if t.shape[0] % world_size:
        raise UsageError(f"global batch {t.shape[0]} is not divisible by world size {world_size}")
    local = t.shape[0] // world_size
    return t[rank * local:(rank + 1) * local]


def _lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def loss_fn(model_name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Mean-reduced loss of the model: the mean makes DP's gradient *average* exact."""
    _check_model(model_name)
    if model_name == "transformer":
        return _lm_loss
    if model_name == "einsum":
        return F.mse_loss
    return F.cross_entropy
