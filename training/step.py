"""One optimizer step, shared by train.py and the benchmarks so both time the same work."""

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from data.batching import Batch
from data.tokenizer import PAD_ID
from model.telemetry import Telemetry


@dataclass(frozen=True)
class StepOptions:
    """How :func:`train_step` trains, beyond the model, data, optimizer, schedule and telemetry.

    Attributes:
        world: ranks under torchrun (DDP averages gradients over them), 1 otherwise.
        label_smoothing: epsilon of the label-smoothed cross-entropy (Szegedy et al. 2016).
        grad_clip: max global gradient L2 norm; None: no clipping (the norm is still returned).
        autocast: the autocast context (bf16 on CUDA) or a null context.
        step_tokens: target tokens of the whole step (all micro-batches, all ranks); set per step.
        record: whether telemetry records this step; set per step.
    """

    world: int
    label_smoothing: float
    grad_clip: float | None
    autocast: AbstractContextManager
    step_tokens: int = 0
    record: bool = False


def train_step(
    model: nn.Module,
    micro: list[Batch],
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    telemetry: Telemetry,
    options: StepOptions,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward over the micro-batches, clip, AdamW step, schedule step.

    The loss of a step is the label-smoothed cross-entropy averaged over all ``step_tokens``
    target tokens of the step (every micro-batch of every rank), so accumulation and data
    parallelism train exactly what one large batch would: micro-batch ``m`` is weighted by
    ``n_m / step_tokens x world`` (DDP averages gradients over ``world`` ranks). Gradients are
    all-reduced once, after the last micro-batch (``no_sync`` before it).

    With ``record``, telemetry watches the first micro-batch's forward pass (with compiled layers,
    through an extra eager pass: :meth:`Telemetry.watch_forward`), the gradients before clipping,
    the parameters before the update (weight spectra, learned scales), and the update; losses and
    weights are bit-identical with it on or off. Nothing here reads a value back to the host.

    Args:
        model: the EncoderDecoder, or it wrapped in DistributedDataParallel.
        micro: this rank's micro-batches; src (B, S), tgt_in / tgt_out (B, T).
        options: world, label smoothing, gradient clipping (``torch.nn.utils.clip_grad_norm_``),
            autocast, the step's target tokens and whether telemetry records.

    Returns:
        (loss, grad_norm): detached 0-dim device tensors; loss = this rank's share of the step
        loss in nats per target token (summed over ranks and divided by ``world`` it is the
        step loss), grad_norm the global L2 norm before clipping.
    """
    o = options
    opt.zero_grad(set_to_none=True)
    total = torch.zeros((), device=micro[0].src.device)
    for m, batch in enumerate(micro):
        last = m == len(micro) - 1
        sync = model.no_sync() if isinstance(model, DistributedDataParallel) and not last else nullcontext()
        taps = nullcontext()
        if o.record and m == 0:
            taps = telemetry.watch_forward(batch.src, batch.tgt_in, batch.src_pad_mask, batch.tgt_pad_mask)
        with sync:
            with o.autocast, taps:
                logits = model(batch.src, batch.tgt_in)  # (B, T, V)
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=o.label_smoothing
            ) * (batch.n_tgt_tokens / o.step_tokens * o.world)  # fmt: skip
            loss.backward()
        total += loss.detach()
    if o.record:
        telemetry.record_grad_norms()
        telemetry.record_parameters()
    # max_norm=inf scales by 1 (a no-op) and still returns the norm, which is logged either way.
    max_norm = math.inf if o.grad_clip is None else o.grad_clip
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    with telemetry.watch_update() if o.record else nullcontext():
        opt.step()
    sched.step()
    return total, grad_norm
