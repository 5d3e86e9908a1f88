"""What one optimizer step did and the AdamW state it left, per block.

- ``update/{s}.{i}/ratio``: ||w_after - w_before|| / ||w_before|| over block i's parameters, of one step, and
  ``update/{s}.{i}.{m}/rms`` and ``.../ratio`` per block matrix m (RMS of W_after - W_before; ||W_after - W_before||_F
  / ||W_before||_F) under either optimizer (:meth:`OptimizerStats.watch_update`, around ``optimizer.step()``; copies
  the weights before it).
- ``update/{s}.{i}/adam_rms`` and ``optim/below_eps``: from AdamW's moments after the step
  (:meth:`OptimizerStats.record_adam`).

Definitions and baselines: docs/telemetry.md, "Update ratio" and "AdamW state".
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from model.transformer import EncoderDecoder
from runlog.metric_names import RESIDUALS, adam_below_eps, adam_rms, matrix_site, matrix_update, update_ratio
from telemetry.config import TelemetryConfig
from telemetry.core import DeviceStats, blocks


class OptimizerStats:
    """Update ratios and AdamW-state statistics of ``model``'s blocks, written into ``stats``."""

    def __init__(self, model: EncoderDecoder, cfg: TelemetryConfig, stats: DeviceStats) -> None:
        self.model = model
        self.cfg = cfg
        self.stats = stats

    @contextmanager
    def watch_update(self) -> Iterator[None]:
        """Around ``optimizer.step()`` (``cfg.updates``): record ||w_after - w_before|| / ||w_before|| per block, and
        per block matrix (``linear_roles()``, as ``weight/``) the update's RMS, sqrt(mean (W_after - W_before)^2), and
        its ratio to the weight, ||W_after - W_before||_F / ||W_before||_F = RMS(update) / RMS(W_before). The update
        includes the weight decay. Under Muon with ``adjust_lr_fn=match_rms_adamw`` an (A, B) matrix moves by
        0.2 sqrt(max(A, B)) lr O (Moonlight, arXiv 2502.16982, sec. 2.2), O the orthogonalized momentum, whose RMS is
        the quadratic mean of its min(A, B) singular values over sqrt(max(A, B)): the update's RMS is 0.2 lr times that
        mean, 0.2 lr if O were orthogonal; Newton-Schulz leaves the singular values below about 1.25 and a gradient
        of low rank some far below 1. Under AdamW the first step's RMS is about lr (each coordinate moves by
        lr g / (|g| + eps)). tests/test_updates.py checks both.
        QK-Clip's rescaling (``optim.qk_clip``) comes after, outside the update measured."""
        if not self.cfg.updates:
            yield
            return
        before = {(stack, i): [p.detach().clone() for p in layer.parameters()] for stack, i, layer in blocks(self.model)}
        matrices = {site: w.detach().clone() for site, w in self._matrices()}  # W itself, also when weight-normalized
        yield
        with torch.no_grad():
            for stack, i, layer in blocks(self.model):
                pairs = zip(layer.parameters(), before[stack, i], strict=True)
                delta = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p - b) for p, b in pairs]))
                weight = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(b) for b in before[stack, i]]))
                self.stats[update_ratio(stack, i).name] = delta / weight
            for (stack, i, site), w in self._matrices():
                change, old = w - matrices[stack, i, site], matrices[stack, i, site]
                self.stats[matrix_update(stack, i, site, "rms").name] = change.square().mean().sqrt()
                ratio = torch.linalg.vector_norm(change) / torch.linalg.vector_norm(old)
                self.stats[matrix_update(stack, i, site, "ratio").name] = ratio

    def _matrices(self) -> Iterator[tuple[tuple[str, int, str], torch.Tensor]]:
        """((stack, block, ``WEIGHT_SITES`` matrix), its weight W (out, in)) of every block matrix, in depth order."""
        for stack, i, layer in blocks(self.model):
            for r in (r for r in RESIDUALS if hasattr(layer, r)):
                for role, linear in getattr(layer, r).branch.linear_roles().items():
                    yield (stack, i, matrix_site(r, role)), linear.weight

    @torch.no_grad()
    def record_adam(self, opt: torch.optim.Optimizer) -> None:
        """Store ``update/{s}.{i}/adam_rms`` per block and ``optim/below_eps`` from ``opt``'s state; call
        right after ``opt.step()``; nothing when ``cfg.adam`` is off.

        With v_hat = ``exp_avg_sq`` / (1 - beta2^t), t = ``state['step']``, the bias-corrected second
        moment that this step's update divided by (it already holds the step's gradient g_t, as StableAdamW's
        debiased u_t does), and g_t = ``p.grad`` (after clipping, as the step read it):

        - ``adam_rms`` = sqrt(mean over the coordinates of block i's parameters that have a gradient of
          g_t^2 / max(v_hat, eps^2)): RMS_t of StableAdamW (Wortsman et al. 2023, "Stable and low-precision
          training for large-scale vision-language models", arXiv 2304.13013, Algorithm 2), pooled over the
          block instead of per tensor. max(v_hat, eps^2) keeps a coordinate whose v is 0 (so is its g) at 0.
        - ``below_eps`` = the share of the coordinates of every parameter ``opt`` holds with
          sqrt(v_hat) < eps (taken as v_hat < eps^2), those where eps dominates Adam's denominator
          sqrt(v_hat) + eps; a parameter without state yet (never had a gradient) counts as v = 0.

        eps and beta2 are each parameter's group's. Everything stays on the device (no ``.item()``:
        the fused optimizer keeps ``step`` there).

        Under ``optim=muon`` (``training.muon.MuonAdamW``) these read its AdamW part (``opt.adamw``): the parameters
        Muon trains have no v, so ``below_eps`` is a share of AdamW's coordinates and a block's ``adam_rms`` pools its
        gains and biases only.

        Raises:
            ValueError: ``opt`` is not ``torch.optim.AdamW`` (nor holds one as ``adamw``), or uses amsgrad (its
                denominator is another v).
        """
        if not self.cfg.adam:
            return
        opt = getattr(opt, "adamw", opt)  # MuonAdamW's AdamW part (telemetry does not import training)
        if not isinstance(opt, torch.optim.AdamW) or any(g["amsgrad"] for g in opt.param_groups):
            raise ValueError(
                f"telemetry.adam reads torch.optim.AdamW without amsgrad, got {type(opt).__name__}; "
                "valid: AdamW(amsgrad=False), or telemetry.adam=false"
            )
        ratio: dict[torch.Tensor, torch.Tensor] = {}  # parameter -> sum of g^2 / max(v_hat, eps^2) over it
        below: list[torch.Tensor] = []
        never_stepped = total = 0
        for group in opt.param_groups:
            beta2, floor = group["betas"][1], group["eps"] ** 2
            for p in group["params"]:
                total += p.numel()
                state = opt.state.get(p)
                if not state:
                    never_stepped += p.numel()
                    continue
                # step as a float64 0-dim tensor: no host sync when the fused optimizer keeps it on the device.
                v_hat = state["exp_avg_sq"].float() / (1 - beta2 ** state["step"].double())
                below.append(v_hat.lt(floor).sum())
                if p.grad is not None:
                    ratio[p] = (p.grad.float().square() / v_hat.clamp_min(floor)).sum()
        if below:  # some parameter has state
            self.stats[adam_below_eps().name] = (torch.stack(below).sum() + never_stepped) / total
        for stack, i, layer in blocks(self.model):
            seen = [p for p in layer.parameters() if p in ratio]
            if seen:
                mean = torch.stack([ratio[p] for p in seen]).sum() / sum(p.numel() for p in seen)
                self.stats[adam_rms(stack, i).name] = mean.sqrt()
