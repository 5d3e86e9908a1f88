"""Normalization layers, written from their formulas, and a registry that builds them by name.

Shape legend: x is (..., D) where D = ``dim`` (d_model); every norm normalizes over the last
dimension only, so the statistics of one row never depend on another row of the batch.

Custom norms compute their statistics in float32 and cast the result back to the input dtype:
squaring bf16/fp16 activations of a few hundred overflows or loses all precision, and a
hand-written fp16 LayerNorm then silently returns zeros.

``custom`` and ``native`` of the same kind have identical parameter names and shapes
(``weight``, and ``bias`` for LayerNorm), so a state dict moves between them.
"""

from collections.abc import Callable

import torch
from torch import nn

NORM_KINDS = ("layernorm", "rmsnorm")
NORM_IMPLS = ("custom", "native")


class LayerNorm(nn.Module):
    """LayerNorm (Ba et al. 2016, arXiv 1607.06450, eq. 4), written from the formula.

    ``y = weight * (x - mean) / sqrt(var + eps) + bias`` with the mean and the *population*
    variance (divided by D) over the last dimension and eps inside the square root; weight
    starts at 1, bias at 0. This is what ``torch.nn.LayerNorm`` computes.

    Args:
        dim: D, the size of the normalized (last) dimension.
        eps: added to the variance inside the square root.

    Shapes: input (..., D) of any float dtype; output the same shape and dtype.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        mean = xf.mean(dim=-1, keepdim=True)  # (..., 1)
        var = (xf - mean).pow(2).mean(dim=-1, keepdim=True)  # (..., 1), population variance
        y = (xf - mean) * torch.rsqrt(var + self.eps)
        return (y * self.weight.float() + self.bias.float()).to(x.dtype)


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
        xf = x.float()
        ms = xf.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        return (xf * torch.rsqrt(ms + self.eps) * self.weight.float()).to(x.dtype)


_REGISTRY: dict[tuple[str, str], Callable[[int, float], nn.Module]] = {
    ("layernorm", "custom"): LayerNorm,
    ("layernorm", "native"): lambda dim, eps: nn.LayerNorm(dim, eps=eps),
    ("rmsnorm", "custom"): RMSNorm,
    ("rmsnorm", "native"): lambda dim, eps: nn.RMSNorm(dim, eps=eps),
}


def check_norm(kind: str, impl: str) -> None:
    """Raise ``ValueError`` naming the bad value and the valid choices if (kind, impl) is unknown."""
    if kind not in NORM_KINDS:
        raise ValueError(f"unknown norm.kind {kind!r}; valid kinds: {', '.join(NORM_KINDS)}")
    if impl not in NORM_IMPLS:
        raise ValueError(f"unknown norm.impl {impl!r}; valid impls: {', '.join(NORM_IMPLS)}")
    if (kind, impl) not in _REGISTRY:
        valid = ", ".join(f"{k}/{i}" for k, i in _REGISTRY)
        raise ValueError(f"norm.kind={kind!r} has no impl {impl!r}; valid kind/impl pairs: {valid}")


def build_norm(kind: str, dim: int, *, impl: str = "custom", eps: float = 1e-5) -> nn.Module:
    """Build the norm ``kind`` over the last dimension of size ``dim``.

    Args:
        kind: one of ``NORM_KINDS``.
        dim: D, the normalized dimension (d_model).
        impl: ``custom`` (this module, from the formula) or ``native`` (``nn.LayerNorm``,
            ``nn.RMSNorm``).
        eps: numerical-stability constant, passed explicitly to native modules too.

    Raises:
        ValueError: unknown kind or impl (the message lists the valid ones).
    """
    check_norm(kind, impl)
    return _REGISTRY[(kind, impl)](dim, eps)
