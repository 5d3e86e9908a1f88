"""Probes of a model's blocks (``python -m scripts.probe``): layer-drop Δloss, angular distance
between residual streams, the output change under a small parameter perturbation at init, and how
much each norm's output depends on the other examples of the batch.

Definitions and sources: docs/telemetry.md, "Probes". Shape legend: B batch, S src length, T tgt
length, D d_model, V tgt vocabulary, L blocks of a stack, N real tokens.
"""

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from data.batching import Batch, Seq2SeqData, collate, make_batches
from data.tokenizer import PAD_ID
from model.batch_reading import BatchReadingNorm, batch_statistics
from model.config import BlockNorm, ModelConfig
from model.transformer import EncoderDecoder
from runlog.metric_names import NORM_SLOTS, RESIDUALS, STACKS, site_name
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
    with ``norm.placement`` set, ``depth`` blocks in each stack, and of ``norm.blocks`` only the entries that set
    a whole stack's kind (``pre_bn``'s LayerNorm decoder: a BatchNorm there would be a config error), their
    other keys dropped.

    Raises:
        ValueError: a placement unknown, or one ``cfg.norm.kind`` cannot take (the message names
            the valid ones); a depth < 1.
    """
    device = batch.src.device
    stack_kinds = tuple(
        BlockNorm(b.stack, sets={"kind": b.sets["kind"]}) for b in cfg.norm.blocks or () if "kind" in b.sets and b.layers is None
    )
    out: dict[str, dict[int, float]] = {}
    for placement in placements:
        norm = replace(cfg.norm, placement=placement, blocks=stack_kinds or None)
        out[placement] = {}
        for depth in depths:
            torch.manual_seed(seed)
            model = EncoderDecoder(replace(cfg, n_enc_layers=depth, n_dec_layers=depth, norm=norm)).to(device)
            out[placement][depth] = output_change(model, batch, delta, seed=seed)
    return out


def first_batch(data: Seq2SeqData, n: int, device: torch.device) -> Batch:
    """The first ``n`` pairs of ``data`` as one padded batch on ``device``."""
    return collate(data, list(range(min(n, len(data))))).to(device)


def two_batches(data: Seq2SeqData, n: int, device: torch.device) -> tuple[Batch, Batch]:
    """Pairs 0..m-1 and m..2m-1 of ``data`` as two padded batches on ``device``, m = min(n, len(data) // 2).

    Raises:
        ValueError: fewer than 4 pairs (two batches of 2, the least :func:`batch_dependence` takes).
    """
    m = min(n, len(data) // 2)
    if m < 2:
        raise ValueError(f"batch dependence needs two batches of 2 pairs or more; got {len(data)} pairs, at least 4 needed")
    return collate(data, list(range(m))).to(device), collate(data, list(range(m, 2 * m))).to(device)


def norm_sites(model: EncoderDecoder) -> Iterator[tuple[str, str, nn.Module]]:
    """(site, stack, norm) of every filled residual norm slot and final norm, in forward order; ``site`` is
    the ``act`` site's name (``runlog.metric_names.site_name``: ``enc.0.self_attn.norm_in``, ``dec.final_norm``).
    The per-head q/k/v norms are not among them: they are token-wise by construction (``ATTENTION_NORM_KINDS``)."""
    for stack in STACKS:
        for i, block in enumerate(blocks(model, stack)):
            for r in (r for r in RESIDUALS if hasattr(block, r)):
                for slot in NORM_SLOTS:
                    norm = getattr(getattr(block, r), slot)
                    if not isinstance(norm, nn.Identity):
                        yield site_name(stack, i, f"{r}.{slot}"), stack, norm
        final = model.enc_final_norm if stack == "enc" else model.dec_final_norm
        if not isinstance(final, nn.Identity):
            yield site_name(stack, None, "final_norm"), stack, final


@contextmanager
def _norms_training(model: EncoderDecoder) -> Iterator[Callable[[], None]]:
    """Within the context, the model is in eval mode (dropout off, the model's only train/eval difference but the
    batch-reading norms') and its batch-reading norms normalize by the batch, over this process's tokens
    (``model.batch_reading.batch_statistics``: a probe runs in one process); yields a function that puts every
    buffer back to its value on entry. On exit the buffers and every module's mode are put back."""
    modes = [(m, m.training) for m in model.modules()]
    saved = [(b, b.clone()) for b in model.buffers()]

    def restore() -> None:
        for b, value in saved:
            b.copy_(value)

    model.eval()
    try:
        with batch_statistics(model):
            yield restore
    finally:
        restore()
        for m, training in modes:
            m.training = training


def _pad_to(t: torch.Tensor, length: int) -> torch.Tensor:
    """``t`` (B, L, ...) padded with zeros (False) along dim 1 to ``length`` positions."""
    return torch.cat([t, t.new_zeros((t.shape[0], length - t.shape[1], *t.shape[2:]))], dim=1)


@torch.no_grad()
def batch_dependence(model: EncoderDecoder, batch_a: Batch, batch_b: Batch, kept: int = 1) -> dict[str, float]:
    """{site: change} for every residual norm site (:func:`norm_sites`): how much the normalized output of the first
    ``kept`` examples of ``batch_a`` changes when the other examples of the batch are those of ``batch_b``.

    The model runs ``batch_a``, then ``batch_b``, with its norms in training mode (batch statistics) and every other
    module in eval mode (no dropout); each norm's input x (B, L, D) is recorded at each site. Then, per site, the
    norm alone normalizes x_A and the composite of x_A's rows 0..kept-1 and x_B's other rows (each with its keep
    mask; the shorter padded to the longer length), and the change is the mean over the real tokens t of the kept
    rows of ||y_composite,t - y_A,t|| / ||y_A,t|| (L2 over D). The mean, not the max: one number per site that is
    the typical token's change, steady from batch to batch, while a max follows the token with the smallest
    ||y_A,t||; both are 0 exactly where no kept token depends on the other rows. A token-wise norm (LayerNorm,
    RMSNorm, ...) gives 0.0 exactly; a batch-reading one (BatchNorm, PowerNorm during its warmup) does not: Ba et
    al. 2016, "Layer Normalization", arXiv 1607.06450, sec. 1 and 3 (batch normalization makes each training case's
    output depend on the other cases of its mini-batch; layer normalization does not).

    Every buffer (running statistics, PowerNorm's iteration count) is restored after each call of a norm and every
    module's mode on exit, so the probe changes nothing in the model.

    Args:
        model: the model; batch_a, batch_b: batches with the same number of rows B (padded lengths may differ).
        kept: the rows of ``batch_a`` kept, 1 <= kept < B.

    Raises:
        ValueError: batches of different row counts, or ``kept`` outside 1..B-1.
    """
    rows = batch_a.src.shape[0]
    if batch_b.src.shape[0] != rows:
        raise ValueError(f"batch_dependence needs batches of the same number of rows, got {rows} and {batch_b.src.shape[0]}")
    if not 1 <= kept < rows:
        raise ValueError(f"kept={kept} is invalid for batches of {rows} rows; valid: 1..{rows - 1}")
    sites = list(norm_sites(model))
    with _norms_training(model) as restore:
        xa, ka = _site_inputs(model, sites, batch_a)
        restore()  # batch_b's pass from the same buffers (PowerNorm after its warmup normalizes by a running one)
        xb, kb = _site_inputs(model, sites, batch_b)
        restore()
        out = {}
        for site, stack, norm in sites:
            length = max(xa[site].shape[1], xb[site].shape[1])
            x = torch.cat([_pad_to(xa[site], length)[:kept], _pad_to(xb[site], length)[kept:]])  # (B, L, D)
            keep = torch.cat([_pad_to(ka[stack], length)[:kept], _pad_to(kb[stack], length)[kept:]])  # (B, L)
            y_a = _normalize(norm, xa[site], ka[stack])[:kept]
            restore()
            y_c = _normalize(norm, x, keep)[:kept, : xa[site].shape[1]]
            restore()
            real = ka[stack][:kept]
            ref = y_a[real].double()  # (N, D)
            out[site] = ((y_c[real].double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)).mean().item()
    return out


def _site_inputs(model: EncoderDecoder, sites: list, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """({site: the norm's input x (B, L, D)}, {stack: keep (B, L) bool, True at real tokens}) of one forward pass."""
    inputs: dict[str, torch.Tensor] = {}
    handles = [norm.register_forward_pre_hook(lambda _, args, s=site: inputs.__setitem__(s, args[0])) for site, _, norm in sites]
    try:
        model(batch.src, batch.tgt_in)
    finally:
        for handle in handles:
            handle.remove()
    pad = model.cfg.pad_id
    return inputs, {"enc": batch.src.ne(pad), "dec": batch.tgt_in.ne(pad)}  # the masks the model passes its norms


def _normalize(norm: nn.Module, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The norm's output for x (B, L, D), called as the model calls it (``model.residual.Residual``)."""
    return norm(x, keep) if isinstance(norm, BatchReadingNorm) else norm(x)
