"""Per-layer activation-scale and gradient-norm telemetry, reduced on the device.

Names (stable, see DESIGN.md sec. 5):
- ``act/{enc|dec}.{i}.out/rms``: RMS of the residual stream leaving block i,
  sqrt(sum x^2 / (n_positions * D)) over non-padding positions;
- ``act/{enc|dec}.{i}.out/maxabs``: max |x| over non-padding positions;
- ``grad/{enc|dec}.{i}/norm``: L2 norm of the gradient of all of block i's parameters.

Statistics stay as device tensors until :meth:`Telemetry.collect`, which moves them to the
host in one transfer. Hooks exist only inside :meth:`Telemetry.watch`, so steps that do not log
pay nothing. Hooks only read their tensors: outputs are identical with telemetry on or off.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from model.transformer import EncoderDecoder


class Telemetry:
    """Collects activation statistics of one forward pass and per-block gradient norms."""

    def __init__(self, model: EncoderDecoder) -> None:
        self.model = model
        self._stats: dict[str, torch.Tensor] = {}

    def _blocks(self) -> Iterator[tuple[str, str, nn.Module]]:
        for stack in ("enc", "dec"):
            layers = self.model.encoder if stack == "enc" else self.model.decoder
            for i, layer in enumerate(layers):
                yield stack, f"{stack}.{i}", layer

    @contextmanager
    def watch(self, src_pad_mask: torch.Tensor, tgt_pad_mask: torch.Tensor) -> Iterator[None]:
        """Record the residual-stream scale after every block during the forward passes inside.

        Args:
            src_pad_mask: (B, S) bool, True at src padding; excluded from encoder statistics.
            tgt_pad_mask: (B, T) bool, True at tgt padding; excluded from decoder statistics.
        """
        keep = {"enc": ~src_pad_mask, "dec": ~tgt_pad_mask}
        handles = []
        for stack, name, layer in self._blocks():

            def hook(module: nn.Module, args: tuple, out: torch.Tensor, name: str = name, stack: str = stack) -> None:
                self._record(f"act/{name}.out", out.detach(), keep[stack])

            handles.append(layer.register_forward_hook(hook))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _record(self, site: str, x: torch.Tensor, keep: torch.Tensor) -> None:
        m = keep[..., None].to(torch.float32)  # (B, L, 1)
        xf = x.float()
        n = m.sum() * x.shape[-1]
        self._stats[f"{site}/rms"] = torch.sqrt((xf.pow(2) * m).sum() / n)
        self._stats[f"{site}/maxabs"] = (xf.abs() * m).amax()

    def record_grad_norms(self) -> None:
        """Store each block's gradient norm; call after ``backward`` and before clipping."""
        for _, name, layer in self._blocks():
            norms = [torch.linalg.vector_norm(p.grad) for p in layer.parameters() if p.grad is not None]
            if norms:
                self._stats[f"grad/{name}/norm"] = torch.linalg.vector_norm(torch.stack(norms))

    def collect(self) -> dict[str, float]:
        """All recorded statistics as Python floats (one device-to-host transfer), then reset."""
        if not self._stats:
            return {}
        names = list(self._stats)
        values = torch.stack([self._stats[k].float() for k in names]).tolist()
        self._stats.clear()
        return dict(zip(names, values, strict=True))
