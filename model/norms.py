"""Normalization layers, written from their formulas, and :func:`build_norm`, which builds a kind by name from its record.

Shape legend: x is (..., D) where D = ``dim`` (d_model); every norm here normalizes over the last
dimension only, so the statistics of one row never depend on another row of the batch. Norms that
read the batch (statistics over the real tokens of all ranks) derive from :class:`BatchReadingNorm`
(``model.batch_reading``, re-exported here), whose docstring is their contract with the model; they live
in their own modules (``model.batchnorm``, ``model.powernorm``); :func:`build_norm` builds them too.

Custom norms compute their statistics in float32 (float64 inputs in float64) and cast the result
back to the input dtype: squaring bf16/fp16 activations of a few hundred overflows or loses all
precision, and a hand-written fp16 LayerNorm then silently returns zeros. Float64 is never narrowed,
so a float64 model is exact to float64 (tests/test_preln_prerms.py relies on it).

``custom`` and ``native`` of the same kind have identical parameter names and shapes
(``weight``, and ``bias`` for LayerNorm), so a state dict moves between them. With ``gain="unit_offset"``
(``model.gains``) the stored gain is ``parametrizations.weight.original`` (w) and ``weight`` reads 1 + w, for
custom and native alike.
"""

import importlib
import math
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

# BatchReadingNorm lives in model.batch_reading so that model.batchnorm can derive from it without an import cycle;
# it is re-exported here, where the model and the docs name it.
from model.batch_reading import BatchReadingNorm as BatchReadingNorm
from model.batch_reading import wide as _wide
from model.gains import apply_unit_offset
from model.kinds import NORM_GAINS, NORM_KIND_RECORDS, NORM_KINDS, check_norm, kind_knobs

DYT_ALPHA_INIT = 0.5  # DyT's alpha_0: the official DynamicTanh's ``alpha_init_value`` default (jiachenzhu/DyT, dynamic_tanh.py)
# Derf's alpha_0 and s_0: zlab-princeton/Derf's ``Dynamic_erf(alpha_init_value=0.5, shift_init_value=0.0)`` defaults, what
# its ViT, DNA and speech code build with (its DiT/train.py: alpha 1.0 for the XL models, 0.5 otherwise; shift 0 always).
DERF_ALPHA_INIT = 0.5
DERF_SHIFT_INIT = 0.0


@runtime_checkable
class BoundedNorm(Protocol):
    """The class of a bounded kind (``model.kinds.NormKind.bounded``): telemetry measures its saturation through
    ``saturation_input`` (``telemetry.activations``)."""

    def saturation_input(self, x: torch.Tensor, level: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(u, t): the bounded function of ``x`` (before weight and bias) is beyond ``level`` of its bound exactly
        where |u| > t; ``x`` (..., D), u the same shape in float32, t broadcastable to it."""
        ...


class LayerNorm(nn.Module):
    """LayerNorm (Ba et al. 2016, arXiv 1607.06450, eq. 4), written from the formula.

    ``y = weight * (x - mean) / sqrt(var + eps) + bias`` with the mean and the *population*
    variance (divided by D) over the last dimension and eps inside the square root; weight
    starts at 1, bias at 0. This is what ``torch.nn.LayerNorm`` computes.

    Args:
        dim: D, the size of the normalized (last) dimension.
        eps: added to the variance inside the square root.
        bias: learn the shift ``bias`` (False: no shift, as ``nn.LayerNorm(bias=False)``).

    Shapes: input (..., D) of any float dtype; output the same shape and dtype.
    """

    def __init__(self, dim: int, eps: float, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _wide(x)
        xc = xf - xf.mean(dim=-1, keepdim=True)  # (..., D), centred
        # The population variance (..., 1) as ||xc||^2 / D: the value of xc.pow(2).mean(-1) to float32 rounding,
        # cheaper to differentiate. vector_norm's backward is grad * xc / ||xc|| (0 where ||xc|| = 0); pow(2).mean's
        # expands the mean's gradient, copies xc for pow's 2 xc and multiplies them, each a new (..., D) tensor.
        var = torch.linalg.vector_norm(xc, dim=-1, keepdim=True).square() / x.shape[-1]
        y = xc * torch.rsqrt(var + self.eps) * _wide(self.weight)
        return (y if self.bias is None else y + _wide(self.bias)).to(x.dtype)


class AnnotatedLayerNorm(nn.Module):
    """The Annotated Transformer's LayerNorm (Rush 2018, "The Annotated Transformer", Harvard NLP, class
    ``LayerNorm``: ``a_2 * (x - mean) / (std + eps) + b_2``), written from that line.

    ``y = weight * (x - mean) / (std + eps) + bias`` over the last dimension, with ``x.std(-1)``'s
    *unbiased* standard deviation (divided by D - 1) and eps added to the std, not inside the square
    root: not :class:`LayerNorm`. With eps -> 0 it is sqrt((D - 1) / D) ~ 1 - 1/(2D) times
    LayerNorm's normalized output (0.78% smaller at D = 64). The source's ``a_2``, ``b_2`` are named
    ``weight``, ``bias`` here (as LayerNorm's, so a state dict moves between the two), weight starts at
    1, bias at 0; its eps default is 1e-6, normlab passes ``norm.eps``. Custom impl only.

    Args:
        dim: D >= 2, the size of the normalized (last) dimension.
        eps: added to the standard deviation.
        bias: learn the shift ``bias``.

    Shapes: input (..., D) of any float dtype; output the same shape and dtype.

    Raises:
        ValueError: ``dim`` < 2 (the unbiased std of one feature divides by 0).
    """

    def __init__(self, dim: int, eps: float, bias: bool = True) -> None:
        super().__init__()
        if dim < 2:
            raise ValueError(f"norm.kind=annotated_ln needs D >= 2 features (its std divides by D - 1), got D={dim}")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _wide(x)
        std = xf.std(dim=-1, keepdim=True)  # (..., 1), unbiased (correction 1), as torch.Tensor.std's default
        y = (xf - xf.mean(dim=-1, keepdim=True)) / (std + self.eps) * _wide(self.weight)
        return (y if self.bias is None else y + _wide(self.bias)).to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467, eq. 4), written from the formula.

    ``y = weight * x / sqrt(mean(x^2) + eps)`` over the last dimension: no mean subtraction
    and no bias; weight starts at 1. This is what ``torch.nn.RMSNorm`` computes when given the
    same eps (its default ``eps=None`` means float32 machine epsilon, so always pass it).

    Args:
        dim: D, the size of the normalized (last) dimension.
        eps: added to the mean square inside the square root.

    Shapes: input (..., D) of any float dtype; output the same shape and dtype.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _wide(x)
        ms = xf.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        return (xf * torch.rsqrt(ms + self.eps) * _wide(self.weight)).to(x.dtype)


class SeeDNorm(nn.Module):
    """SeeDNorm (Cai et al. 2025, "SeeDNorm: Self-Rescaled Dynamic Normalization", ICLR 2026, arXiv 2510.22777,
    the SeeDNorm equation of its method section): ``y = [tanh(x . beta) * alpha + weight] * x / sqrt(mean(x^2) + eps)``,
    RMSNorm whose gain is conditioned on the input. **Experimental**: no official code was found (2026), so it is
    written from the paper's formula alone.

    Shapes, as the paper's ``sigma(x beta^T) alpha + gamma`` with x in R^(N x D) and alpha, beta, gamma in
    R^(1 x D): ``x . beta`` is a dot product over the last dimension, one scalar per token (..., 1), so the
    input-conditioned term moves every channel's gain by ``alpha`` times one shared per-token factor in (-1, 1).
    ``weight`` is the paper's gamma (the static gain, named as every kind's gain); ``alpha`` and ``beta`` keep the
    paper's names. The paper's multi-head variant is not built.

    Init (the paper's was not found): weight 1, alpha 1, beta 0, so tanh(x . beta) = 0 and SeeDNorm is exactly
    RMSNorm at init; alpha = 0 would do the same, but with beta = 0 too neither would get a gradient (d/dalpha
    carries tanh(x . beta) = 0, d/dbeta carries alpha = 0), and a random beta would spend RNG draws and change every
    later parameter's init. With alpha = 1, beta gets a gradient from the first step (alpha's is 0 until beta
    moves). With alpha = 0 SeeDNorm is RMSNorm for any beta. No shift (``norm.bias`` is ignored). Computed in
    float32 (float64 inputs: float64).

    Args:
        dim: D, the size of the normalized (last) dimension.
        eps: added to the mean square inside the square root.

    Shapes: input (..., D); output the same shape and dtype.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def dynamic(self, x: torch.Tensor) -> torch.Tensor:
        """tanh(x . beta): (..., D) -> (..., 1), the per-token factor of the input-conditioned gain."""
        return torch.tanh(_wide(x) @ _wide(self.beta)).unsqueeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _wide(x)
        ms = xf.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        gain = self.dynamic(x) * _wide(self.alpha) + _wide(self.weight)  # (..., D)
        return (xf * torch.rsqrt(ms + self.eps) * gain).to(x.dtype)


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019, arXiv 1910.05895, eq. 9): ``y = g * x / max(||x||_2, eps)``.

    One learned scalar ``weight`` (g), initialized to sqrt(D) as in the paper, so that the
    output starts with unit RMS. The L2 norm is taken in float32 (float64 inputs: float64).

    Shapes: input (..., D); output the same shape and dtype.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.tensor([dim**0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _wide(x)
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(self.eps)  # (..., 1)
        return (xf * (_wide(self.weight) / norm)).to(x.dtype)


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization", arXiv 2503.10622,
    eq. 1): ``y = weight * tanh(alpha * x) + bias``, no statistics at all.

    ``alpha`` is one learned scalar, initialized to ``alpha_init`` (default ``DYT_ALPHA_INIT`` = 0.5, the paper's
    default alpha_0 and the official ``DynamicTanh``'s ``alpha_init_value``; the model passes the
    ``norm.alpha_init_*`` of the norm's site); ``weight`` starts at 1 and ``bias`` at 0. Computed in float32
    (float64 inputs: float64).

    Shapes: input (..., D); output the same shape and dtype.
    """

    def __init__(self, dim: int, bias: bool = True, alpha_init: float = DYT_ALPHA_INIT) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor([float(alpha_init)]))  # float: an int from the command line (=1) too
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(_wide(self.alpha) * _wide(x)) * _wide(self.weight)
        return (y if self.bias is None else y + _wide(self.bias)).to(x.dtype)

    def saturation_input(self, x: torch.Tensor, level: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(u, t): |tanh(alpha x)| > ``level`` exactly where |u| > t; u = x in float32, t = atanh(level) / |alpha|
        (a threshold on |x| is cheaper than tanh). ``level`` in (0, 1)."""
        return x.float(), math.atanh(level) / self.alpha.detach().float().abs()


class Derf(nn.Module):
    """Dynamic erf (Chen et al. 2025, "Stronger Normalization-Free Transformers", arXiv 2512.10938, eq. 10):
    ``y = weight * erf(alpha * x + shift) + bias``, no statistics at all.

    ``alpha`` and ``shift`` are one learned scalar each (shape (1,), as the official ``Dynamic_erf`` of
    zlab-princeton/Derf: the shift is inside erf, before the per-channel weight and bias), initialized to
    ``alpha_init`` (default ``DERF_ALPHA_INIT`` = 0.5, the official ``alpha_init_value``; the model passes the
    ``norm.alpha_init_*`` of the norm's site) and ``DERF_SHIFT_INIT`` = 0 (``shift_init_value``); ``weight``
    starts at 1 and ``bias`` at 0. erf is bounded by 1 like tanh, so the output is bounded by
    ``|weight| + |bias|``. Computed in float32 (float64 inputs: float64).

    Shapes: input (..., D); output the same shape and dtype.
    """

    def __init__(self, dim: int, bias: bool = True, alpha_init: float = DERF_ALPHA_INIT) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor([float(alpha_init)]))  # float: an int from the command line (=1) too
        self.shift = nn.Parameter(torch.tensor([DERF_SHIFT_INIT]))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.erf(_wide(self.alpha) * _wide(x) + _wide(self.shift)) * _wide(self.weight)
        return (y if self.bias is None else y + _wide(self.bias)).to(x.dtype)

    def saturation_input(self, x: torch.Tensor, level: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(u, t): |erf(alpha x + shift)| > ``level`` exactly where |u| > t; u = alpha x + shift in float32,
        t = erfinv(level). ``level`` in (0, 1)."""
        u = x.float() * self.alpha.detach().float() + self.shift.detach().float()
        return u, torch.erfinv(torch.tensor(level, dtype=torch.float64)).float()


class DyISRU(nn.Module):
    """Dynamic Inverse Square Root Unit (Stollenwerk 2025, "On the Mathematical Relationship Between
    Layer Normalization and Dynamic Activation Functions", arXiv 2503.21708 v3), the element-wise
    counterpart of RMSNorm: ``y = weight * sqrt(D) * x / sqrt(beta + x^2) + bias``.

    RMSNorm's ``y_i = sqrt(D) x_i / sqrt(x_i^2 + sum_{j != i} x_j^2)`` with the other channels' sum
    replaced by one learned scalar ``beta`` (the paper's global parameter). The paper gives no init;
    normlab starts beta at D: for unit-RMS input that sum is about D - 1, so DyISRU then matches
    RMSNorm to a relative ``1 - (1 + x_i^2 / D)^(-1/2) <= x_i^2 / (2D)`` per element. ``weight`` starts
    at 1 and ``bias`` at 0, as DyT's. The output is bounded by ``|weight| sqrt(D) + |bias|``.
    Computed in float32; beta must stay > 0 (it starts at D and gets no weight decay, being a scalar).

    Shapes: input (..., D); output the same shape and dtype.
    """

    def __init__(self, dim: int, bias: bool = True) -> None:
        super().__init__()
        self.scale = dim**0.5
        self.beta = nn.Parameter(torch.tensor([float(dim)]))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _wide(x)
        y = self.scale * xf * torch.rsqrt(_wide(self.beta) + xf.pow(2)) * _wide(self.weight)
        return (y if self.bias is None else y + _wide(self.bias)).to(x.dtype)

    def saturation_input(self, x: torch.Tensor, level: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(u, t): |x| / sqrt(beta + x^2) > ``level`` exactly where |u| > t; u = x in float32,
        t = level sqrt(beta / (1 - level^2)) (beta > 0). ``level`` in (0, 1)."""
        return x.float(), level * torch.sqrt(self.beta.detach().float() / (1 - level**2))


class L2Norm(nn.Module):
    """L2 normalization ``y = x / max(||x||_2, eps)`` over the last dimension, no parameters (what
    ``F.normalize(x, dim=-1, eps=eps)`` computes): q and k per head in QK-norm (Henry et al. 2020,
    "Query-Key Normalization for Transformers", Findings of EMNLP; official code CyndxAI/QKNorm,
    ``F.normalize`` then the learned scale ``ScaleUp``), the scale being
    ``model.attention.MultiHeadAttention``'s ``temperature``. Computed in float32 (float64 input: float64). An attention-site
    kind only (its record: ``residual=False``).

    Shapes: input (..., D); output the same shape and dtype.
    """

    def __init__(self, dim: int, eps: float) -> None:  # dim: unused (no parameters); every kind's class takes it
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _wide(x)
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(self.eps)  # (..., 1)
        return (xf / norm).to(x.dtype)


def _norm_class(path: str) -> Callable[..., nn.Module]:
    """The class a record names as ``module:Class`` (imported here: ``model.kinds`` stays torch-free)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def build_norm(
    kind: str,
    dim: int,
    *,
    impl: str = "custom",
    eps: float = 1e-5,
    bias: bool = True,
    gain: str = "plain",
    attention: bool = False,
    alpha_init: float | None = None,
    knobs: Any = None,
) -> nn.Module:
    """Build the norm ``kind`` over the last dimension of size ``dim``, from its record
    (``model.kinds.NORM_KIND_RECORDS``: the class of ``impl``, and which of the arguments below it takes).

    Args:
        kind: a residual-stream kind (``model.kinds.NORM_KINDS``; ``none`` is ``nn.Identity``, the no-norm baseline);
            with ``attention``, any kind with a record (``l2`` too; ``NormSpec`` narrows the config's choices).
        dim: D, the normalized dimension (d_model; d_head at an attention site).
        impl: ``custom`` (from the formula) or ``native`` (torch's module, where the record names one).
        eps: numerical-stability constant, passed explicitly to native modules too; kinds whose record has
            ``eps=False`` take none.
        bias: learn the shift of the kinds whose record has ``shift``; ignored by the others.
        gain: ``plain`` (the gain ``weight`` is stored as is) or ``unit_offset`` (stored as w, applied as 1 + w:
            ``model.gains``); ignored by kinds without a gain (``none``, ``l2``).
        attention: the norm sits at an attention site (q, k or v over d_head).
        alpha_init: the initial alpha of the kinds whose record has ``alpha`` (``dyt``, ``derf``); None: the class's
            own default (``DYT_ALPHA_INIT``, ``DERF_ALPHA_INIT``, both 0.5); other kinds ignore it.
        knobs: the kind's own settings, an instance of its record's ``knobs`` dataclass (powernorm's
            ``model.kinds.PowerNormKnobs``), passed as the keywords its fields name; None: the class defaults.

    Raises:
        ValueError: unknown kind, impl or gain, or a kind without that impl (the message lists the
            valid ones); what the kind's class raises (powernorm: ``dim`` not divisible by its groups).
    """
    check_norm(kind, impl, kinds=tuple(NORM_KIND_RECORDS) if attention else NORM_KINDS)
    if gain not in NORM_GAINS:
        raise ValueError(f"unknown norm.gain {gain!r}; valid: {', '.join(NORM_GAINS)}")
    record = NORM_KIND_RECORDS[kind]
    kwargs: dict[str, Any] = {"eps": eps} if record.eps else {}
    if record.shift:
        kwargs["bias"] = bias
    if record.alpha and alpha_init is not None:
        kwargs["alpha_init"] = alpha_init
    if record.knobs and knobs is not None:
        kwargs |= asdict(kind_knobs(kind, knobs))
    norm = _norm_class(record.native if impl == "native" and record.native else record.custom)(dim, **kwargs)
    return apply_unit_offset(norm) if gain == "unit_offset" else norm
