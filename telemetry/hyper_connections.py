"""The composite residual gain of hyper-connections (``hc/``): per stack, how much the product of its sublayers'
residual mixing matrices can amplify the streams (forward) and their gradients (backward), the "Amax Gain
Magnitude" of Xie et al. 2025 (mHC, arXiv 2512.24880, sec. 3.1, Fig. 3): max row sum and max column sum of
|A_L^T ... A_1^T| (``model.hyper_connections.composite_gain``), the largest over the batch's real tokens. 1 and 1
for doubly stochastic A (mHC, up to Sinkhorn's residual), unbounded for HC's; at HC's init (A = I) both are 1.

Read by a forward pre-hook on each sublayer's hyper-connection, from the streams it receives; the stack's gain is
formed when its last sublayer has run. A model without ``norm.hc`` gets no hook and records nothing.
"""

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from model.hyper_connections import composite_gain
from model.transformer import EncoderDecoder
from runlog.metric_names import RESIDUALS, hc_gain
from telemetry.core import DeviceStats, stacks


class HyperConnectionStats:
    """``hc/{s}/{fwd_gain|bwd_gain}`` of the forward passes run while :meth:`hooks`' handles exist, into ``stats``."""

    def __init__(self, model: EncoderDecoder, stats: DeviceStats) -> None:
        self.model = model
        self.stats = stats

    def hooks(self, src_pad_mask: torch.Tensor, tgt_pad_mask: torch.Tensor) -> list[RemovableHandle]:
        """Register the pre-hooks (none without hyper-connections); the caller removes them. Masks (B, L) bool,
        True at padding: padding positions are left out of the max."""
        if self.model.cfg.norm.hc is None:
            return []
        handles = []
        for stack, _, layers, _ in stacks(self.model):
            keep = ~(src_pad_mask if stack == "enc" else tgt_pad_mask)
            hcs = [getattr(layer, r).hc for layer in layers for r in RESIDUALS if hasattr(layer, r)]
            matrices: list[torch.Tensor] = []
            for hc in hcs:
                handles.append(hc.register_forward_pre_hook(self._hook(stack, matrices, len(hcs), keep)))
        return handles

    def _hook(self, stack: str, matrices: list[torch.Tensor], count: int, keep: torch.Tensor):
        @torch.no_grad()
        def hook(mod: nn.Module, args: tuple) -> None:
            with torch.autocast(args[0].device.type, enabled=False):
                matrices.append(mod.residual_matrix(args[0].detach().float()).float())
                if len(matrices) < count:
                    return
                for stat, gain in zip(("fwd_gain", "bwd_gain"), composite_gain(matrices), strict=True):
                    # static HC: one matrix for all tokens (0-dim gain); otherwise (B, L), padding set to 0 (gains >= 0)
                    self.stats[hc_gain(stack, stat).name] = gain if gain.dim() == 0 else gain.masked_fill(~keep, 0).amax()
                matrices.clear()

        return hook
