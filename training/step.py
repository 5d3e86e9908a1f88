"""One optimizer step, shared by train.py and the benchmarks so both time the same work."""

from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from data.batching import Batch
from data.tokenizer import PAD_ID
from model.telemetry import Telemetry


def train_step(
    model: nn.Module,
    micro: list[Batch],
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    telemetry: Telemetry,
    *,
    step_tokens: int,
    world: int = 1,
    record: bool,
    label_smoothing: float,
    grad_clip: float,
    autocast: AbstractContextManager,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward over the micro-batches, clip, AdamW step, schedule step.

    The loss of a step is the label-smoothed cross-entropy averaged over all ``step_tokens``
    target tokens of the step (every micro-batch of every rank), so accumulation and data
    parallelism train exactly what one large batch would: micro-batch ``m`` is weighted by
    ``n_m / step_tokens x world`` (DDP averages gradients over ``world`` ranks). Gradients are
    all-reduced once, after the last micro-batch (``no_sync`` before it).

    With ``record``, telemetry watches the first micro-batch's forward pass (with compiled layers,
    through an extra eager pass: :meth:`Telemetry.watch_forward`), the gradients before clipping,
    and the update; losses and weights are bit-identical with it on or off. Nothing here reads a
    value back to the host.

    Args:
        model: the EncoderDecoder, or it wrapped in DistributedDataParallel.
        micro: this rank's micro-batches; src (B, S), tgt_in / tgt_out (B, T).

    Returns:
        (loss, grad_norm): detached 0-dim device tensors; loss = this rank's share of the step
        loss in nats per target token (summed over ranks and divided by ``world`` it is the
        step loss), grad_norm the global L2 norm before clipping.
    """
    opt.zero_grad(set_to_none=True)
    total = torch.zeros((), device=micro[0].src.device)
    for m, batch in enumerate(micro):
        last = m == len(micro) - 1
        sync = model.no_sync() if isinstance(model, DistributedDataParallel) and not last else nullcontext()
        taps = nullcontext()
        if record and m == 0:
            taps = telemetry.watch_forward(batch.src, batch.tgt_in, batch.src.eq(PAD_ID), batch.tgt_out.eq(PAD_ID))
        with sync:
            with autocast, taps:
                logits = model(batch.src, batch.tgt_in)  # (B, T, V)
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=label_smoothing
            ) * (batch.n_tgt_tokens / step_tokens * world)  # fmt: skip
            loss.backward()
        total += loss.detach()
    if record:
        telemetry.record_grad_norms()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    with telemetry.watch_update() if record else nullcontext():
        opt.step()
    sched.step()
    return total, grad_norm
