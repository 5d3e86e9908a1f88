"""One optimizer step, shared by train.py and the benchmarks so both time the same work."""

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.profiler import record_function
from torch.nn.parallel import DistributedDataParallel

from data.batching import Batch
from data.tokenizer import PAD_ID
from telemetry.recorder import Telemetry
from training.qk_clip import QKClip, clip_after_update, watched


@dataclass(frozen=True)
class StepOptions:
    """How :func:`train_step` trains, beyond the model, data, optimizer, schedule and telemetry.

    Attributes:
        world: ranks under torchrun (DDP averages gradients over them), 1 otherwise.
        label_smoothing: epsilon of the label-smoothed cross-entropy (Szegedy et al. 2016).
        grad_clip: max global gradient L2 norm; None: no clipping (the norm is still returned).
        autocast: the autocast context (bf16 on CUDA) or a null context.
        z_loss: coefficient c of the auxiliary loss c * mean((log Z)^2) (``optim.z_loss``); 0: off.
        step_tokens: target tokens of the whole step (all micro-batches, all ranks); set per step.
        record: whether telemetry records this step; set per step.
        qk_clip: QK-Clip after the update (``optim.qk_clip``, ``training.qk_clip``); None: off.
    """

    world: int
    label_smoothing: float
    grad_clip: float | None
    autocast: AbstractContextManager
    z_loss: float = 0.0
    step_tokens: int = 0
    record: bool = False
    qk_clip: QKClip | None = None


class StepResult(NamedTuple):
    """What :func:`train_step` returns: detached 0-dim device tensors.

    Attributes:
        loss: this rank's share of the step's cross-entropy in nats per target token (summed over
            ranks and divided by ``world`` it is the step's loss); the z-loss is not in it.
        grad_norm: the global gradient L2 norm before clipping.
        z_loss: this rank's share of the step's z-loss term c * mean((log Z)^2), summed like ``loss``;
            0 when ``z_loss`` is off.
    """

    loss: torch.Tensor
    grad_norm: torch.Tensor
    z_loss: torch.Tensor


def token_losses(logits: torch.Tensor, tgt_out: torch.Tensor, options: StepOptions) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The mean label-smoothed cross-entropy over the real target tokens of one micro-batch, and the
    mean z-loss term c * (log Z)^2 over them (None when ``options.z_loss`` is 0, so that a run
    without z-loss computes exactly what it did before the option existed).

    The z-loss is PaLM's auxiliary loss (Chowdhery et al. 2022, arXiv 2204.02311, sec. 5:
    "z_loss = 1e-4 * log^2 Z", Z = sum_v exp z_v the softmax normalizer): it pulls log Z toward 0,
    keeping the output logits from drifting (Wortsman et al. 2023, arXiv 2309.14322, sec. 3.1,
    "output logit divergence").

    Args:
        logits: (B, T, V) output logits; tgt_out: (B, T) target ids, ``PAD_ID`` at padding.
    """
    flat = logits.flatten(0, 1).float()  # (B * T, V)
    target = tgt_out.flatten()
    ce = F.cross_entropy(flat, target, ignore_index=PAD_ID, label_smoothing=options.label_smoothing)
    if not options.z_loss:
        return ce, None
    real = target.ne(PAD_ID)
    log_z = flat.logsumexp(-1)  # (B * T,); masked below rather than indexing flat, a copy of (B * T, V)
    return ce, options.z_loss * torch.where(real, log_z.square(), 0.0).sum() / real.sum()


def train_step(
    model: nn.Module,
    micro: list[Batch],
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    telemetry: Telemetry,
    options: StepOptions,
) -> StepResult:
    """Forward and backward over the micro-batches, clip, AdamW step, QK-Clip (when on), schedule step.

    The loss of a step is the label-smoothed cross-entropy averaged over all ``step_tokens`` target tokens of the
    step (every micro-batch of every rank), so accumulation and data parallelism train exactly what one large batch
    would: micro-batch ``m`` is weighted by ``n_m / step_tokens x world`` (DDP averages gradients over ``world``
    ranks). Gradients are all-reduced once, after the last micro-batch (``no_sync`` before it). With ``z_loss`` =
    c > 0 the objective adds c * mean((log Z)^2) over the same tokens, weighted the same way (:func:`token_losses`).

    Telemetry is called at three named points, which record only with ``record``: around the first
    micro-batch's forward pass (activations, attention and output logits; with compiled layers through
    an extra eager pass), after the backward passes (gradients before clipping, parameters before the
    update) and around the update (update ratios, AdamW's state after it): :class:`telemetry.Telemetry`.
    Losses and weights are bit-identical with it on or off. Nothing here reads a value back to the host.

    Args:
        model: the EncoderDecoder, or it wrapped in DistributedDataParallel.
        micro: this rank's micro-batches; src (B, S), tgt_in / tgt_out (B, T).
        options: world, label smoothing, z-loss, gradient clipping (``clip_grad_norm_``), autocast, the step's
            target tokens, whether telemetry records, and QK-Clip (reads every micro-batch's forward).

    Returns:
        :class:`StepResult` (loss, grad_norm, z_loss).
    """
    o = options
    opt.zero_grad(set_to_none=True)
    total = torch.zeros((), device=micro[0].src.device)
    z_total = torch.zeros((), device=micro[0].src.device)
    for m, batch in enumerate(micro):
        last = m == len(micro) - 1
        sync = model.no_sync() if isinstance(model, DistributedDataParallel) and not last else nullcontext()
        with sync:
            with o.autocast, telemetry.around_forward(batch, record=o.record and m == 0), watched(o.qk_clip, batch):
                logits = model(batch.src, batch.tgt_in)  # (B, T, V)
            weight = batch.n_tgt_tokens / o.step_tokens * o.world
            ce, z = token_losses(logits, batch.tgt_out, o)
            loss = ce * weight
            if z is not None:
                z = z * weight
                z_total += z.detach()
            (loss if z is None else loss + z).backward()
        total += loss.detach()
    telemetry.after_backward(record=o.record)
    # max_norm=inf scales by 1 (a no-op) and still returns the norm, which is logged either way.
    max_norm = math.inf if o.grad_clip is None else o.grad_clip
    with record_function("normlab::clip"):  # a named range for training.step_profile (the optimizer's has its own)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    with telemetry.around_update(opt, record=o.record):
        opt.step()
    clip_after_update(o.qk_clip, o.world, telemetry.stats if o.record else None)
    sched.step()
    return StepResult(total, grad_norm, z_total)
