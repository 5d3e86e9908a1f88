"""The output logits z (B, T, V) of the training pass, read from the logits the step already has
(no extra forward pass): ``out/logz`` = the mean over real target tokens of log Z, Z = sum_v exp z_v
(the softmax normalizer that PaLM's z-loss pulls toward 0: Chowdhery et al. 2022, arXiv 2204.02311,
sec. 5), and ``out/max_logit`` = the largest z over real tokens and the vocabulary (Wortsman et al.
2023, arXiv 2309.14322, sec. 3.1, "output logit divergence"). Definitions and Gaussian baselines:
docs/telemetry.md, "Output logits".
"""

import math

import torch

from runlog.metric_names import output_logits
from telemetry.config import TelemetryConfig
from telemetry.core import DeviceStats


class LogitStats:
    """``out/logz`` and ``out/max_logit``, written into ``stats``; nothing when ``cfg.logits`` is off."""

    def __init__(self, cfg: TelemetryConfig, stats: DeviceStats) -> None:
        self.cfg = cfg
        self.stats = stats

    @torch.no_grad()
    def record(self, logits: torch.Tensor, tgt_pad_mask: torch.Tensor) -> None:
        """Store ``out/logz`` and ``out/max_logit`` of ``logits``, read in float32 as the loss reads them.

        Args:
            logits: (B, T, V) output logits of the training forward pass.
            tgt_pad_mask: (B, T) bool, True at target padding (left out).
        """
        if not self.cfg.logits:
            return
        z = logits.detach().float()
        keep = (~tgt_pad_mask).float()  # (B, T)
        self.stats[output_logits("logz").name] = (z.logsumexp(-1) * keep).sum() / keep.sum()
        self.stats[output_logits("max_logit").name] = z.amax(-1).masked_fill(tgt_pad_mask, -math.inf).amax()
