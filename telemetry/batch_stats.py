"""Batch-statistics fluctuation (``bstat/``): at each batch-reading norm (BatchNorm, PowerNorm), how far the
statistics of the batch it normalizes lie from the running statistics it keeps, the diagnostic of Shen et al.
2020 ("PowerNorm: Rethinking Batch Normalization in Transformers", ICML, arXiv 2003.07845, sec. 3, Fig. 2 and 3).

For each statistic the norm's :meth:`~model.batch_reading.BatchReadingNorm.batch_vs_running` returns, batch
value a (D,) and running value b (D,), the paper's average Euclidean distance ``dist(a, b) = ||a - b||_2 / D``
is written to ``bstat/{s}.{i}.{r}.{slot}/{statistic}_dist`` (``bstat/{s}.final_norm/...`` for a stack's final
norm): ``mean_dist`` and ``var_dist`` at a BatchNorm, ``phi_dist`` at a PowerNorm. Names are formatted only by
``runlog/metric_names.py``; definition and reading: docs/telemetry.md.

Read by a forward *pre*-hook, on the norm's input and keep mask as the model passes them (``args``), so the
running buffers are those before this pass's update: the running statistics the batch's are compared with in
the paper. A model without batch-reading norms gets no hook.
"""

from collections.abc import Iterator

import torch
from torch.utils.hooks import RemovableHandle

from model.batch_reading import BatchReadingNorm
from model.transformer import EncoderDecoder
from runlog.metric_names import BATCH_STATISTICS, NORM_SLOTS, RESIDUALS, batch_stat_dist
from telemetry.config import TelemetryConfig
from telemetry.core import DeviceStats, stacks


class BatchStats:
    """``bstat/`` of the forward passes run while :meth:`hooks`' handles exist, written into ``stats``."""

    def __init__(self, model: EncoderDecoder, cfg: TelemetryConfig, stats: DeviceStats) -> None:
        self.model = model
        self.cfg = cfg
        self.stats = stats

    def norms(self) -> Iterator[tuple[str, int | None, str, BatchReadingNorm]]:
        """(stack, layer or None, site, norm) of every batch-reading norm in forward order: residual slots
        (site ``{r}.{slot}``), then the stack's final norm (layer None, site ``final_norm``)."""
        for stack, _, layers, final in stacks(self.model):
            for i, layer in enumerate(layers):
                for r in (r for r in RESIDUALS if hasattr(layer, r)):
                    for slot in NORM_SLOTS:
                        if isinstance(norm := getattr(getattr(layer, r), slot), BatchReadingNorm):
                            yield stack, i, f"{r}.{slot}", norm
            if isinstance(final, BatchReadingNorm):
                yield stack, None, "final_norm", final

    def hooks(self) -> list[RemovableHandle]:
        """Register a pre-hook on every batch-reading norm (none when ``cfg.batch_stats`` is off); the caller removes them."""
        if not self.cfg.batch_stats:
            return []
        handles = []
        for stack, layer, site, norm in self.norms():
            names = {s: batch_stat_dist(stack, layer, site, s).name for s in BATCH_STATISTICS}

            def hook(mod: BatchReadingNorm, args: tuple, names: dict[str, str] = names) -> None:
                x, keep = args  # (B, L, D), (B, L) bool: what the norm is about to read
                with torch.autocast(x.device.type, enabled=False):  # float32 inside the training pass's autocast too
                    for statistic, (batch, running) in mod.batch_vs_running(x.detach(), keep).items():
                        self.stats[names[statistic]] = torch.linalg.vector_norm(batch - running) / batch.numel()

            handles.append(norm.register_forward_pre_hook(hook))
        return handles
