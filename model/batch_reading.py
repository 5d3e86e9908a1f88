"""The door for norms that read the batch: :class:`BatchReadingNorm`, the contract between the model and
such a norm (BatchNorm, PowerNorm), and ``wide``, the float32 promotion every custom norm computes in.

Its own module so that a batch-reading kind's module (``model.batchnorm``, ``model.powernorm``) and ``model.norms``, which
builds it, both import it without importing each other; ``model.norms`` re-exports
``BatchReadingNorm``.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or in its own dtype where that is wider (float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class BatchReadingNorm(nn.Module):
    """Base of the norms whose statistics read the batch (BatchNorm, PowerNorm), not one token's vector.

    The model calls a subclass as ``norm(x, keep)`` wherever a residual stream is normalized, and a
    token-wise norm as ``norm(x)``: which call a slot makes is decided once, when the block is built
    (``model.residual.Residual``, ``model.transformer.EncoderDecoder``), so token-wise norms pay
    nothing. Telemetry's hooks see ``args[0]`` = x either way.

    Shapes: x (B, L, D), one stream; ``keep`` (B, L) bool, True at its real (non-pad) tokens;
    returns (B, L, D) in x's dtype. What ``keep`` is, where:

    - encoder (every slot of every block, and ``enc_final_norm``): ``~src_pad_mask``;
    - decoder (every slot of its self-attention, cross-attention and FFN sublayers, and
      ``dec_final_norm``): ``tgt_in != pad_id``, the target stream's real tokens, also in the
      cross-attention, whose queries are target positions;
    - incremental decoding (a ``DecoderCache``, beam search): the new positions' mask; the model
      allows it in eval mode only (``EncoderDecoder.decode`` raises ``RuntimeError`` otherwise).

    The contract a subclass keeps:

    - training mode (``self.training``): statistics over the tokens where ``keep`` is True, summed
      over the ranks of ``self.group`` when it is set; they are updated into running buffers
      registered with ``register_buffer`` (so the state dict saves them, a resume restores them
      and ``.to()`` moves them). In the decoder these statistics include future positions of the
      same sentence, a causality leak (docs/norms.md, "Norms that read the batch"), measured where it is allowed.
    - eval mode: the running statistics only, so each token's output depends on that token alone
      and incremental decoding gives what a full pass gives.
    - ``group``: the data-parallel process group (``EncoderDecoder.set_norm_group``); None: the
      statistics of this process only.
    - :meth:`batch_vs_running`: the batch's statistics beside the running ones they are compared with
      (telemetry's ``bstat/``), read without side effects.

    Attention's norm sites (``q_norm``, ``k_norm``, ``v_norm``, over d_head) stay token-wise:
    ``model.attention.ATTENTION_NORM_KINDS`` admits no batch-reading kind.
    """

    def __init__(self) -> None:
        super().__init__()
        self.group: torch.distributed.ProcessGroup | None = None

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """x (B, L, D), keep (B, L) bool -> (B, L, D).

        Raises:
            NotImplementedError: always; a subclass defines it.
        """
        raise NotImplementedError(f"{type(self).__name__} must define forward(x, keep)")

    def batch_vs_running(self, x: torch.Tensor, keep: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The statistics a training-mode forward on (x, keep) would take of this process's real tokens, each
        beside the running buffer it is blended into, read under ``no_grad`` and changing nothing (no buffer
        update, no collective: under data parallel, this rank's tokens only). Telemetry's ``bstat/`` family
        (docs/telemetry.md) compares the two.

        Shapes: x (B, L, D), keep (B, L) bool -> {statistic: (batch value (D,), running value (D,))}, in float32
        (float64 input: float64); statistic names in ``runlog.metric_names.BATCH_STATISTICS``.

        Raises:
            NotImplementedError: always; a subclass defines it.
        """
        raise NotImplementedError(f"{type(self).__name__} must define batch_vs_running(x, keep)")


@contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """Restore every buffer of ``model`` (BatchNorm's running statistics, PowerNorm's ``iters``, ...) to its value
    on entry, so that the training-mode forward passes inside update nothing that outlives them."""
    saved = {name: b.clone() for name, b in model.named_buffers()}
    try:
        yield
    finally:
        for name, b in model.named_buffers():
            b.copy_(saved[name])


@contextmanager
def batch_statistics(model: nn.Module) -> Iterator[None]:
    """Within the context, every :class:`BatchReadingNorm` of ``model`` runs its training-mode forward (BatchNorm: the
    statistics of the batch it is given; PowerNorm: the batch's within its warmup, ``running_phi`` after it) while
    the rest of the model keeps its mode (call it in eval mode: no dropout),
    and reads this process's tokens only (``group`` None: the caller may be one rank alone, as validation is).
    Each norm's mode and group come back on exit; the buffers its forward passes update do not: wrap each pass in
    :func:`buffers_kept`."""
    norms = [m for m in model.modules() if isinstance(m, BatchReadingNorm)]
    saved = [(m.training, m.group) for m in norms]
    try:
        for m in norms:
            m.train()
            m.group = None
        yield
    finally:
        for m, (training, group) in zip(norms, saved, strict=True):
            m.train(training)
            m.group = group
