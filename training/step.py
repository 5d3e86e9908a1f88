"""One optimizer step, shared by train.py and the benchmarks so both time the same work."""

from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F

from data.batching import Batch
from data.tokenizer import PAD_ID
from model.telemetry import Telemetry
from model.transformer import EncoderDecoder


def train_step(
    model: EncoderDecoder,
    batch: Batch,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    telemetry: Telemetry,
    *,
    record: bool,
    label_smoothing: float,
    grad_clip: float,
    autocast: AbstractContextManager,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward, label-smoothed cross-entropy, backward, clip, AdamW step, schedule step.

    With ``record``, telemetry watches the forward pass, the gradients (before clipping) and
    the update. Nothing here reads a value back to the host.

    Returns:
        (loss, grad_norm): detached 0-dim device tensors; loss in nats per target token (with
        label smoothing), grad_norm the global L2 norm before clipping.
    """
    taps = telemetry.watch(batch.src.eq(PAD_ID), batch.tgt_out.eq(PAD_ID)) if record else nullcontext()
    with autocast, taps:
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=label_smoothing
    )
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if record:
        telemetry.record_grad_norms()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    with telemetry.watch_update() if record else nullcontext():
        opt.step()
    sched.step()
    return loss.detach(), grad_norm
