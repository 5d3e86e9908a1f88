"""Probes of a model's blocks (``python -m scripts.probe``): layer-drop Δloss, angular distance
between residual streams, and the output change under a small parameter perturbation at init.

Definitions and sources: docs/telemetry.md, "Probes". Shape legend: B batch, S src length, T tgt
length, D d_model, V tgt vocabulary, L blocks of a stack, N real tokens.
"""

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from data.batching import Batch, Seq2SeqData, collate, make_batches
from data.tokenizer import PAD_ID
from model.config import ModelConfig
from model.transformer import EncoderDecoder
from runlog.metric_names import STACKS
from training.evaluate import evaluate_loss


class SkippedBlock(nn.Module):
    """A block replaced by the identity ``x -> x``: it returns the residual stream it is given and
    ignores the rest of a block's call (``EncoderLayer(x, src_pad_mask, keep=...)``,
    ``DecoderLayer(x, memory, src_pad_mask, cache, keep=...)``). Shapes: (B, L, D) -> (B, L, D)."""

    def forward(self, x: torch.Tensor, *context: object, keep: torch.Tensor | None = None) -> torch.Tensor:
        return x


def blocks(model: EncoderDecoder, stack: str) -> nn.ModuleList:
    """The blocks of ``stack`` (``enc`` or ``dec``); raises ValueError naming a bad stack and the valid ones."""
    if stack not in STACKS:
        raise ValueError(f"unknown stack {stack!r}; valid: {', '.join(STACKS)}")
    return model.encoder if stack == "enc" else model.decoder


@contextmanager
def skip_block(model: EncoderDecoder, stack: str, index: int) -> Iterator[None]:
    """Within the context, block ``index`` of ``stack`` is a :class:`SkippedBlock`; the block comes
    back on exit. A post-LN block's skip skips its norms too (they sit inside the block).

    Raises:
        ValueError: a bad stack, or ``index`` outside ``0..L-1`` (the message names the valid range).
    """
    layers = blocks(model, stack)
    if not 0 <= index < len(layers):
        raise ValueError(f"block index {index} is invalid for the {stack} stack; valid: 0..{len(layers) - 1}")
    block = layers[index]
    layers[index] = SkippedBlock()
    try:
        yield
    finally:
        layers[index] = block


def layer_drop(model: EncoderDecoder, data: Seq2SeqData, max_tokens: int, device: torch.device) -> tuple[float, dict]:
    """(full loss, {stack: [Δloss per block]}): the validation loss with block i skipped
    (:func:`skip_block`) minus the full model's, the loss being ``training.evaluate.evaluate_loss``
    (mean cross-entropy per target token, nats, no label smoothing) over ``data``.
    Gromov et al. 2024, "The Unreasonable Ineffectiveness of the Deeper Layers", arXiv 2403.17887
    (the loss as layers are dropped); Li et al. 2025, Mix-LN, arXiv 2412.13795, Fig. 3."""
    full = evaluate_loss(model, data, max_tokens, device)
    drops: dict[str, list[float]] = {}
    for stack in STACKS:
        drops[stack] = []
        for i in range(len(blocks(model, stack))):
            with skip_block(model, stack, i):
                drops[stack].append(evaluate_loss(model, data, max_tokens, device) - full)
    return full, drops


def angular_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """d(x, y) = arccos(cos(x, y)) / pi in [0, 1] over the last dimension (Gromov et al. 2024,
    arXiv 2403.17887, eq. 7), computed as 2 atan2(|u - v|, |u + v|) / pi with u, v the unit vectors
    (Kahan's form of the angle: arccos loses half the digits near 0 and pi); a zero vector is at
    distance 1/2 from everything, as cos = 0. Shapes: (..., D), (..., D) broadcast -> (...)."""
    u, v = F.normalize(x.float(), dim=-1), F.normalize(y.float(), dim=-1)
    return 2 * torch.atan2((u - v).norm(dim=-1), (u + v).norm(dim=-1)) / math.pi


@torch.no_grad()
def stream_distances(model: EncoderDecoder, data: Seq2SeqData, max_tokens: int, device: torch.device) -> dict:
    """{stack: (L+1) x (L+1) nested list}: entry [l][m] is the mean over the real tokens of ``data``
    of :func:`angular_distance` between the residual stream entering block l and entering block m,
    index L being the last block's output (before the stack's final norm). Gromov et al. 2024,
    arXiv 2403.17887, eq. 7 (there: the last token only; here: every real token)."""
    was_training = model.training
    model.eval()
    streams: dict[str, list[torch.Tensor]] = {stack: [] for stack in STACKS}
    sums = {s: torch.zeros(len(blocks(model, s)) + 1, len(blocks(model, s)) + 1, device=device) for s in STACKS}
    count = dict.fromkeys(STACKS, 0)
    handles = []
    for stack in STACKS:
        for block in blocks(model, stack):
            handles.append(block.register_forward_pre_hook(lambda _, args, s=stack: streams[s].append(args[0])))
        last = blocks(model, stack)[-1]
        handles.append(last.register_forward_hook(lambda _, args, out, s=stack: streams[s].append(out)))
    try:
        for index in make_batches(data, max_tokens):
            batch = collate(data, index).to(device)
            model(batch.src, batch.tgt_in)
            real = {"enc": ~batch.src_pad_mask, "dec": batch.tgt_out.ne(PAD_ID)}
            for stack in STACKS:
                xs = torch.stack([x[real[stack]] for x in streams[stack]])  # (L+1, N, D)
                for l in range(len(xs)):  # noqa: E741 - the paper's l
                    sums[stack][l] += angular_distance(xs[l], xs).sum(-1)  # one row at a time: (L+1, N, D) memory
                count[stack] += xs.shape[1]
                streams[stack].clear()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return {stack: (sums[stack] / count[stack]).tolist() for stack in STACKS}


@torch.no_grad()
def output_change(model: EncoderDecoder, batch: Batch, delta: float, draws: int = 4, seed: int = 0) -> float:
    """E |f(x, w) - f(x, w + δ)|^2: the squared L2 distance of the logits (V) at each real target
    position, averaged over those positions and ``draws`` perturbations, in eval mode. Each parameter
    tensor p gets δ_p = delta * rms(p) * ε, ε ~ N(0, I) from a generator seeded ``seed`` (a tensor
    that is all zeros, as biases and ReZero's gate at init, is not perturbed); the weights are put
    back after each draw. Liu et al. 2020, Admin, arXiv 2004.08249, sec. 4 ("output change" under
    W* = W + δ, Post-LN's growing with depth and Pre-LN's not)."""
    was_training = model.training
    model.eval()
    base = model(batch.src, batch.tgt_in)  # (B, T, V)
    real = batch.tgt_out.ne(PAD_ID)
    params = list(model.parameters())  # tied weights once
    saved = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(draws):
        for p in params:
            noise = torch.randn(p.shape, generator=generator).to(p.device)
            p.add_(noise * (delta * p.detach().float().pow(2).mean().sqrt()))
        total += (model(batch.src, batch.tgt_in) - base)[real].float().pow(2).sum(-1).mean().item()
        for p, w in zip(params, saved, strict=True):
            p.copy_(w)
    model.train(was_training)
    return total / draws


def init_output_change(
    cfg: ModelConfig, placements: Sequence[str], depths: Sequence[int], batch: Batch, delta: float, seed: int = 0
) -> dict[str, dict[int, float]]:
    """{placement: {depth: :func:`output_change`}} of models freshly built (seed ``seed``) from ``cfg``
    with ``norm.placement`` set, no ``norm.blocks``, and ``depth`` blocks in each stack.

    Raises:
        ValueError: a placement unknown, or one ``cfg.norm.kind`` cannot take (the message names
            the valid ones); a depth < 1.
    """
    device = batch.src.device
    out: dict[str, dict[int, float]] = {}
    for placement in placements:
        norm = replace(cfg.norm, placement=placement, blocks=None)
        out[placement] = {}
        for depth in depths:
            torch.manual_seed(seed)
            model = EncoderDecoder(replace(cfg, n_enc_layers=depth, n_dec_layers=depth, norm=norm)).to(device)
            out[placement][depth] = output_change(model, batch, delta, seed=seed)
    return out


def first_batch(data: Seq2SeqData, n: int, device: torch.device) -> Batch:
    """The first ``n`` pairs of ``data`` as one padded batch on ``device``."""
    return collate(data, list(range(min(n, len(data))))).to(device)
