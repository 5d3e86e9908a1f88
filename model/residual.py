"""Residual connections with the norm at a chosen placement (``model.placements``).

x is the residual stream (B, T, D); F is the sublayer (attention or FFN); N is the chosen norm.
One block computes ``x <- norm_out(alpha * x + dropout(g * norm_branch(F(s * norm_in(x)))) [+ skip])``;
its placement record, resolved for the sublayer and its depth (``Placement.plan``), says which slots
hold a norm, alpha, the input factor s (LayerNorm Scaling: on ``norm_in(x)`` and on a cross-attention's
memory, the other normalized input of that sublayer), whether the skip starts from
``norm_in(x)`` instead of x (HybridNorm's FFN), the learned gate g (ReZero, LayerScale), and whether
the block input comes back as ``skip`` (B2T). With ``norm.gpas`` a block's sublayers share one
:class:`GPAS` (Chen et al. 2025), applied to the sum, or to the skip where ``norm_out`` closes the sublayer.

Dropout acts on the branch output, after N2 for sandwich. Each norm slot a placement leaves
empty, and the gate when there is none, is an ``nn.Identity``, so module paths (and telemetry
names) are stable across placements. A norm that reads the batch
(``model.norms.BatchReadingNorm``) is called with the stream's keep mask as well.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from model.norms import BatchReadingNorm
from model.placements import ResidualPlan


class Gate(nn.Module):
    """``y = weight * x``: a learned scale on a branch output, one scalar (ReZero, Bachlechner et al.
    2021, arXiv 2003.04887, eq. 4: alpha init 0) or one per channel (LayerScale, Touvron et al. 2021,
    arXiv 2103.17239, eq. 6: diag(lambda)). Shapes: (..., D) -> (..., D); ``weight`` is (1,) or (D,)."""

    def __init__(self, size: int, init: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


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


class Residual(nn.Module):
    """``x <- norm_out(alpha * x + dropout(gate(norm_branch(branch(in_scale * norm_in(x), *context)))) [+ skip])``,
    with ``norm_in(x)`` in place of the first x when the plan's ``normed_skip`` is set, and ``in_scale * memory``
    in place of a cross-attention's memory (``context[0]`` when not None).

    ``gpas`` (GPAS, Chen et al. 2025; see :class:`GPAS`) scales the stream that carries on, as the official code
    places it (``modeling_llama.py``, ``LlamaDecoderLayer.forward``): where ``norm_out`` is empty (pre-LN, sandwich,
    LNS, Mix-LN's pre-LN blocks) it follows the residual addition, ``x <- gpas(x + F(N(x)))``; where ``norm_out``
    closes the sublayer (post-LN, DeepNorm, Mix-LN's post-LN blocks) it scales the skip before alpha,
    ``x <- N(alpha * gpas(x) + F(x))``, the branch still reading the unscaled x. B2T's block ``skip`` is not scaled.

    ``in_scale`` (LayerNorm Scaling, Sun et al. 2025, arXiv 2502.05795, eq. 8) scales every normalized input of
    the sublayer: the official code (decoder-only) scales the norm output that its self-attention and FFN read; a
    cross-attention also reads the memory, the encoder's final-norm output, and scaling both it and the queries
    treats it as self-attention is treated (logits x s^2, values x s), so all three branches of a decoder block are
    damped about alike (docs/norms.md, ``lns``). Scaling the queries only would shrink the logits and leave the
    values, and so the branch output, nearly unscaled.

    Args:
        branch: the sublayer F; called as ``branch(normed_x, *context)``.
        plan: the filled slots, alpha, in_scale and gate (``model.placements.Placement.plan``).
        make_norm: builds one norm over D (called once per filled slot); the placement already
            admitted its kind.
        dropout: dropout probability on the branch output.
        dim: D, the size of a per-channel gate.
        gate: the gate to use when the plan has one and it is shared with the block's other
            sublayers (ReZero); None: a new one from the plan.
        gpas: the block's :class:`GPAS`, shared by its sublayers (one gate per layer, as the official
            ``GPASBlock`` is called after both sublayers of a decoder layer); None: no GPAS.
        hc: the hyper-connection (``model.hyper_connections``) that reads the sublayer's input from the
            n residual streams and writes its update back, in place of ``x + update``; None: the plain
            residual. The config admits it only with a plan that has no ``norm_out``, alpha 1, no normed
            skip and no block skip (``ModelConfig``).

    Shapes: x (B, T, D) -> (B, T, D); ``skip`` (forward) the same shape as x; ``keep`` (forward)
    (B, T) bool, True at the stream's real tokens.
    """

    def __init__(
        self,
        branch: nn.Module,
        plan: ResidualPlan,
        make_norm: Callable[[], nn.Module],
        dropout: float,
        dim: int,
        gate: Gate | None = None,
        gpas: GPAS | None = None,
        hc: nn.Module | None = None,
    ) -> None:
        super().__init__()

        def slot(used: bool) -> nn.Module:
            return make_norm() if used else nn.Identity()

        use_in, use_branch, use_out = plan.slots
        self.alpha = plan.alpha
        self.in_scale = plan.in_scale
        self.normed_skip = plan.normed_skip
        self.norm_in = slot(use_in)
        self.branch = branch
        self.norm_branch = slot(use_branch)
        self.gate: nn.Module
        if plan.gate is None:
            self.gate = nn.Identity()
        else:
            self.gate = gate if gate is not None else Gate(dim if plan.gate[0] else 1, plan.gate[1])
        self.dropout = nn.Dropout(dropout)
        self.norm_out = slot(use_out)
        self.gpas = gpas
        self.gpas_on_skip = use_out  # a closing norm rescales the sum anyway: GPAS scales the skip instead
        self.hc = hc
        # Which slots read the batch, decided here so that token-wise norms are called as norm(x) at no cost.
        self.in_reads, self.branch_reads, self.out_reads = (
            isinstance(n, BatchReadingNorm) for n in (self.norm_in, self.norm_branch, self.norm_out)
        )

    def forward(
        self,
        x: torch.Tensor,
        *context: torch.Tensor | None,
        skip: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``skip``: a tensor added before ``norm_out`` as well (B2T's block input); None: none.
        ``keep``: the stream's keep mask, passed to the slots that hold a ``BatchReadingNorm``
        (required where one does; token-wise norms never see it). With ``hc``, x holds the n streams
        (B, T, n*D) and the hyper-connection adds the update to them."""
        if self.hc is not None:
            return self.hc(x, lambda h: self._update(self._norm_in(h, keep), context, keep))
        h = self._norm_in(x, keep)
        if self.normed_skip:  # HybridNorm's FFN: the normed stream is what carries on
            x = h
        y = self.gpas(x) if self.gpas is not None and self.gpas_on_skip else x
        y = y if self.alpha == 1.0 else y * self.alpha
        y = y + self._update(h, context, keep)
        y = y if skip is None else y + skip
        if self.gpas is not None and not self.gpas_on_skip:
            y = self.gpas(y)
        return self.norm_out(y, keep) if self.out_reads else self.norm_out(y)

    def _norm_in(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        return self.norm_in(x, keep) if self.in_reads else self.norm_in(x)

    def _update(self, h: torch.Tensor, context: tuple, keep: torch.Tensor | None) -> torch.Tensor:
        """``dropout(gate(norm_branch(branch(in_scale * h, *context))))`` for h the ``norm_in`` output."""
        if self.in_scale != 1.0:
            h = h * self.in_scale
            if context and context[0] is not None:  # a cross-attention's memory (self-attention passes None)
                context = (context[0] * self.in_scale, *context[1:])
        f = self.branch(h, *context)
        f = self.norm_branch(f, keep) if self.branch_reads else self.norm_branch(f)
        return self.dropout(self.gate(f))
