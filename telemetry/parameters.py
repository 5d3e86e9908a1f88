"""The parameters themselves: each block's gradient norm, each block matrix's spectrum and every
learned scale, read as they are before the step's update.

- ``grad/{s}.{i}/norm``: the L2 norm of block i's parameter gradients, before clipping.
- ``weight/{s}.{i}.{m}/{sigma_max|stable_rank}``: each block matrix's spectral norm by power iteration,
  warm-started from the last record's vector (across resumes too: :meth:`ParameterStats.state_dict`),
  and ||W||_F^2 / sigma_max^2.
- ``scale/{s}.{i}.{site}/{stat}``: norm gains, DyT's and Derf's alpha, Derf's shift, DyISRU's beta, SeeDNorm's alpha and
  beta, ReZero / LayerScale gates, the l2 QK-norm temperature, the block's GPAS gate.

Definitions and Gaussian baselines: docs/telemetry.md.
"""

import torch
import torch.nn.functional as F
from torch import nn

from model.gpas import GPASResidual
from model.norms import SeeDNorm
from model.residual import Gate
from model.transformer import EncoderDecoder
from runlog.metric_names import (
    ATTENTION_NORM_SITES,
    ATTENTIONS,
    GPAS_SITE,
    NORM_SLOTS,
    RESIDUALS,
    grad_norm,
    learned_scale,
    matrix_site,
    weight_spectrum,
)
from telemetry.config import TelemetryConfig
from telemetry.core import DeviceStats, blocks

POWER_ITERS = 3  # power iterations per record step and matrix, from the vector the last record left
POWER_ITERS_FIRST = 200  # on a matrix's first record, from a random vector: within 1.5 % on the hardest D = 64
# matrices found, where torch's spectral_norm's 15 at init read up to 12 % low (docs/telemetry.md, "Tolerance")
POWER_SEED = 0  # seeds each matrix's first vector on a generator of its own, never the global one

WeightSite = tuple[str, int, str]  # (stack, layer, matrix site) of ``weight/{stack}.{layer}.{site}/{stat}``


class ParameterStats:
    """Gradient norms, weight spectra (with each matrix's power-iteration vector) and learned scales of
    ``model``'s blocks, written into ``stats``."""

    def __init__(self, model: EncoderDecoder, cfg: TelemetryConfig, stats: DeviceStats) -> None:
        self.model = model
        self.cfg = cfg
        self.stats = stats
        self._power: dict[WeightSite, torch.Tensor] = {}  # weight site -> right singular vector estimate

    def record_grad_norms(self) -> None:
        """Store each block's gradient norm (``cfg.grads``); call after ``backward`` and before clipping."""
        if not self.cfg.grads:
            return
        for stack, i, layer in blocks(self.model):
            norms = [torch.linalg.vector_norm(p.grad) for p in layer.parameters() if p.grad is not None]
            if norms:
                self.stats[grad_norm(stack, i).name] = torch.linalg.vector_norm(torch.stack(norms))

    @torch.no_grad()
    def record(self) -> None:
        """Store every block matrix's spectrum (``cfg.weights``) and every learned scale (``cfg.scales``) as the
        parameters are now, on the device; the step calls it on record steps before ``optimizer.step()``."""
        if self.cfg.weights:
            for stack, i, layer in blocks(self.model):
                for r in (r for r in RESIDUALS if hasattr(layer, r)):
                    for role, linear in getattr(layer, r).branch.linear_roles().items():
                        self._record_spectrum((stack, i, matrix_site(r, role)), linear.weight)
        if self.cfg.scales:
            for stack, i, layer in blocks(self.model):
                for r in (r for r in RESIDUALS if hasattr(layer, r)):
                    self._record_scales(stack, i, r, getattr(layer, r))
                if isinstance(layer.self_attn, GPASResidual):  # one GPAS per block, shared by its sublayers
                    g = _scalar(layer.self_attn.gpas.gate)
                    self.stats[learned_scale(stack, i, GPAS_SITE, "g").name] = g
                    self.stats[learned_scale(stack, i, GPAS_SITE, "silu_g").name] = F.silu(g)

    def _record_spectrum(self, key: WeightSite, weight: torch.Tensor) -> None:
        """sigma_max and stable rank of ``weight`` (out, in) by power iteration (Miyato et al. 2018,
        arXiv 1802.05957, Alg. 1; ``torch.nn.utils.parametrizations.spectral_norm``): u = normalize(W v),
        v = normalize(W^T u), sigma = u^T W v = ||W^T u||. The vector v persists per matrix across
        record steps and resumes (``POWER_ITERS`` iterations each; ``POWER_ITERS_FIRST`` from a ``POWER_SEED``
        vector on the first; :meth:`state_dict`), so the estimate, a lower bound, converges over records
        as the weights drift.
        Stable rank = ||W||_F^2 / sigma^2 (Rudelson & Vershynin 2007), 0 for W = 0."""
        w = weight.detach().float()
        v = self._power.get(key)
        iters = POWER_ITERS
        if v is None:
            # Drawn on the CPU from a generator of its own: the same start on every device, the global RNG untouched.
            v = F.normalize(torch.randn(w.shape[1], generator=torch.Generator().manual_seed(POWER_SEED)), dim=0)
            v, iters = v.to(w.device), POWER_ITERS_FIRST
        start = v
        for _ in range(iters):
            wtu = w.mT @ F.normalize(w @ v, dim=0)  # (in,)
            v = F.normalize(wtu, dim=0)
        sigma = torch.linalg.vector_norm(wtu)
        # A zero matrix sends v to 0 for good: keep the start, so a later record of a nonzero W still converges.
        self._power[key] = torch.where(sigma > 0, v, start)
        stack, i, site = key
        self.stats[weight_spectrum(stack, i, site, "sigma_max").name] = sigma
        stable_rank = w.square().sum() / sigma.square().clamp_min(torch.finfo(torch.float32).tiny)
        self.stats[weight_spectrum(stack, i, site, "stable_rank").name] = stable_rank

    def state_dict(self) -> dict[str, dict[WeightSite, torch.Tensor]]:
        """What a checkpoint carries so that a resumed run's ``weight/.../sigma_max`` series goes on as if
        never stopped: ``power``, each matrix's power-iteration vector v ((in,) float32, on the CPU), keyed
        by (stack, layer, site). No generator state is needed: a matrix's first vector comes from a
        generator seeded anew with ``POWER_SEED``."""
        return {"power": {key: v.cpu() for key, v in self._power.items()}}

    def load_state_dict(self, state: dict[str, dict[WeightSite, torch.Tensor]]) -> None:
        """Continue from :meth:`state_dict`'s vectors, moved to the model's device."""
        device = next(self.model.parameters()).device
        self._power = {tuple(key): v.to(device) for key, v in state["power"].items()}

    def _record_scales(self, stack: str, i: int, r: str, residual: nn.Module) -> None:
        """The learned scales of residual ``r`` of block ``i``: its norm slots, its gate, and, in an
        attention, its per-head norms and l2 QK-norm temperature."""
        modules = {f"{r}.{slot}": getattr(residual, slot) for slot in NORM_SLOTS} | {f"{r}.gate": residual.gate}
        if r in ATTENTIONS:
            attn = residual.branch
            modules |= {f"{r}.{h}": getattr(attn, h) for h in ATTENTION_NORM_SITES}
            if attn.temperature is not None:
                self.stats[learned_scale(stack, i, r, "temperature").name] = _scalar(attn.temperature)
        for site, module in modules.items():
            for stat, value in _scale_stats(module).items():
                self.stats[learned_scale(stack, i, site, stat).name] = value


def _scalar(p: torch.Tensor) -> torch.Tensor:
    """A one-element parameter as a 0-dim float32 copy (a view would show the value after the step)."""
    return p.detach().float().reshape(()).clone()


def _scale_stats(module: nn.Module) -> dict[str, torch.Tensor]:
    """The learned scales of a norm or residual gate, as 0-dim float32 tensors: ``gain_mean`` = mean and
    ``gain_max`` = max |.| of its ``weight`` (LayerNorm's / RMSNorm's gain, ScaleNorm's g, DyT's and
    DyISRU's weight, LayerScale's lambda): the gain applied, so under ``norm.gain=unit_offset`` (``model.gains``) the
    effective 1 + w, which ``weight`` reads; except a scalar gate's, ReZero's alpha, given as ``alpha``;
    DyT's and Derf's ``alpha``, Derf's ``shift`` and DyISRU's ``beta``; SeeDNorm's ``dyn_max`` = max |alpha| (its effective gain
    ``tanh(x . beta) alpha + weight`` stays within ``weight +- |alpha|``) and ``beta_norm`` = ||beta||_2
    (``|x . beta| <= ||x|| ||beta||``: how far the input can push tanh). None of them for ``nn.Identity`` or
    ``L2Norm`` (no parameters)."""
    weight = getattr(module, "weight", None)
    if isinstance(module, Gate) and weight.numel() == 1:
        return {"alpha": _scalar(weight)}
    stats = {}
    if isinstance(weight, torch.Tensor):
        w = weight.detach().float()
        stats = {"gain_mean": w.mean(), "gain_max": w.abs().amax()}
    if isinstance(module, SeeDNorm):  # alpha and beta are vectors (D,), not DyT's / DyISRU's scalars
        alpha, beta = module.alpha.detach().float(), module.beta.detach().float()
        return stats | {"dyn_max": alpha.abs().amax(), "beta_norm": torch.linalg.vector_norm(beta)}
    # DyT's / Derf's alpha, Derf's shift, DyISRU's beta (parameters, unlike a Residual's float alpha)
    for stat in ("alpha", "shift", "beta"):
        p = getattr(module, stat, None)
        if isinstance(p, nn.Parameter):
            stats[stat] = _scalar(p)
    return stats
