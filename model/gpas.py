"""GPAS on a residual sublayer (``norm.gpas``): Gradient-Preserving Activation Scaling (Chen et al. 2025, NeurIPS,
arXiv 2506.22049; official code dandingsky/GPAS), a modifier any placement takes.

:class:`GPAS` is the scaling itself; :class:`GPASResidual` is a ``model.residual.Residual`` whose stream the block's
GPAS scales where the official code places it (``modeling_llama.py``, ``LlamaDecoderLayer.forward``): after the
residual sum where no norm closes the sublayer, on the skip where one does. ``model.layers`` builds it in place of
the plain ``Residual`` when the block's ``gpas`` is set.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from model.placements import ResidualPlan
from model.residual import Gate, Residual


class GPAS(nn.Module):
    """Gradient-Preserving Activation Scaling (Chen et al. 2025, "GPAS: Accelerating Convergence of LLM
    Pretraining via Gradient-Preserving Activation Scaling", NeurIPS, arXiv 2506.22049; official code
    dandingsky/GPAS, ``GPASBlock``): ``y = x - SiLU(gate) * stopgrad(x)``.

    The forward value is ``(1 - SiLU(gate)) * x``, while dy/dx is the identity: the stream is scaled down
    without scaling the gradient that flows back through it. ``gate`` is one learned scalar, init 0
    (the official ``gate_init_value``), where SiLU(0) = 0 and y == x exactly. dy/dgate = -SiLU'(gate) * x.

    Shapes: x (..., D) -> (..., D); ``gate`` is (1,) (normlab's one-element scalars; the official one is 0-dim).
    """

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In x's dtype, as the official 0-dim gate is by type promotion: a (1,) float32 gate would widen a bf16 stream.
        return x - F.silu(self.gate).to(x.dtype) * x.detach()


class GPASResidual(Residual):
    """A :class:`~model.residual.Residual` (arguments, shapes and the plan's formula as there) with the block's
    :class:`GPAS` scaling the stream that carries on, as the official code places it: where ``norm_out`` is empty
    (pre-LN, sandwich, LNS, Mix-LN's pre-LN blocks) it follows the residual addition, ``x <- gpas(x + F(N(x)))``;
    where ``norm_out`` closes the sublayer (post-LN, DeepNorm, Mix-LN's post-LN blocks), which would rescale the
    sum anyway, it scales the skip before alpha, ``x <- N(alpha * gpas(x) + F(x))``, the branch still reading the
    unscaled x. B2T's block ``skip`` is not scaled.

    Args (after ``Residual``'s):
        gpas: the block's :class:`GPAS`, shared by its sublayers (one gate per layer, as the official
            ``GPASBlock`` is called after both sublayers of a decoder layer).
    """

    def __init__(
        self,
        branch: nn.Module,
        plan: ResidualPlan,
        make_norm: Callable[[], nn.Module],
        dropout: float,
        dim: int,
        gate: Gate | None = None,
        *,
        gpas: GPAS,
    ) -> None:
        super().__init__(branch, plan, make_norm, dropout, dim, gate)
        self.gpas = gpas
        self.on_skip = plan.slots[2]  # a norm_out closes the sublayer: GPAS scales the skip

    def forward(
        self,
        x: torch.Tensor,
        *context: torch.Tensor | None,
        skip: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As ``Residual.forward``, GPAS applied to the sum or to the skip (class docstring)."""
        if not self.on_skip:  # norm_out is the identity: the sum is the stream that carries on
            return self.gpas(super().forward(x, *context, skip=skip, keep=keep))
        h = self.normalize_in(x, keep)
        return self.add(self.gpas(self.carried(x, h)), h, context, skip, keep)
