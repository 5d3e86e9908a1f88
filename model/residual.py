"""Residual connections with the norm at a chosen placement (``model.placements``).

x is the residual stream (B, T, D); F is the sublayer (attention or FFN); N is the chosen norm.
One block computes ``x <- norm_out(alpha * x + c * dropout(g * norm_branch(F(s * norm_in(x)))) [+ skip])``;
its placement record, resolved for the sublayer and its depth (``Placement.plan``), says which slots
hold a norm, alpha, the input factor s (LayerNorm Scaling: on ``norm_in(x)`` and on a cross-attention's
memory, the other normalized input of that sublayer), whether the skip starts from
``norm_in(x)`` instead of x (HybridNorm's FFN), the learned gate g (ReZero, LayerScale), and whether
the block input comes back as ``skip`` (B2T); c is 1 but under ``model.parametrization=completep``
(``ResidualPlan.branch_scale``, CompleteP's 1 / m_L). The other residual mechanisms build on :class:`Sublayer`, each in
a module of its own: GPAS on the sum (``model.gpas.GPASResidual``, ``norm.gpas``) and hyper-connections in place of
the sum (``model.hyper_residual.HyperResidual``, ``norm.hc``); ``model.layers`` picks one per sublayer.

Dropout acts on the branch output, after N2 for sandwich. Each norm slot a placement leaves
empty, and the gate when there is none, is an ``nn.Identity``, so module paths (and telemetry
names) are stable across placements. A norm that reads the batch
(``model.norms.BatchReadingNorm``) is called with the stream's keep mask as well.
"""

from collections.abc import Callable

import torch
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


class Sublayer(nn.Module):
    """A sublayer's planned slots and its update ``c * dropout(gate(norm_branch(branch(in_scale * h, *context))))``
    (c: the plan's ``branch_scale``),
    without the sum that carries the stream on: :class:`Residual` adds it to the stream, ``HyperResidual`` to the
    hyper-connection's streams.

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
    """

    def __init__(
        self,
        branch: nn.Module,
        plan: ResidualPlan,
        make_norm: Callable[[], nn.Module],
        dropout: float,
        dim: int,
        gate: Gate | None = None,
    ) -> None:
        super().__init__()

        def slot(used: bool) -> nn.Module:
            return make_norm() if used else nn.Identity()

        use_in, use_branch, use_out = plan.slots
        self.alpha = plan.alpha
        self.in_scale = plan.in_scale
        self.normed_skip = plan.normed_skip
        self.branch_scale = plan.branch_scale
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
        # Which slots read the batch, decided here so that token-wise norms are called as norm(x) at no cost.
        self.in_reads, self.branch_reads, self.out_reads = (
            isinstance(n, BatchReadingNorm) for n in (self.norm_in, self.norm_branch, self.norm_out)
        )

    def normalize_in(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """``norm_in(x)``, with ``keep`` where the norm reads the batch. (B, T, D) -> (B, T, D)."""
        return self.norm_in(x, keep) if self.in_reads else self.norm_in(x)

    def update(self, h: torch.Tensor, context: tuple, keep: torch.Tensor | None) -> torch.Tensor:
        """``c * dropout(gate(norm_branch(branch(in_scale * h, *context))))`` for h the ``norm_in`` output, with
        ``in_scale * memory`` in place of a cross-attention's memory (``context[0]`` when not None).
        (B, T, D) -> (B, T, D)."""
        if self.in_scale != 1.0:
            h = h * self.in_scale
            if context and context[0] is not None:  # a cross-attention's memory (self-attention passes None)
                context = (context[0] * self.in_scale, *context[1:])
        f = self.branch(h, *context)
        f = self.norm_branch(f, keep) if self.branch_reads else self.norm_branch(f)
        f = self.dropout(self.gate(f))
        return f if self.branch_scale == 1.0 else f * self.branch_scale


class Residual(Sublayer):
    """``x <- norm_out(alpha * x + update(norm_in(x)) [+ skip])``, the placement plan's residual connection, with
    ``norm_in(x)`` in place of the first x when the plan's ``normed_skip`` is set; ``update`` as
    :meth:`Sublayer.update`, arguments as :class:`Sublayer`.

    Shapes: x (B, T, D) -> (B, T, D); ``skip`` (forward) the same shape as x; ``keep`` (forward)
    (B, T) bool, True at the stream's real tokens.
    """

    def forward(
        self,
        x: torch.Tensor,
        *context: torch.Tensor | None,
        skip: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``skip``: a tensor added before ``norm_out`` as well (B2T's block input); None: none.
        ``keep``: the stream's keep mask, passed to the slots that hold a ``BatchReadingNorm``
        (required where one does; token-wise norms never see it)."""
        h = self.normalize_in(x, keep)
        return self.add(self.carried(x, h), h, context, skip, keep)

    def carried(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The stream the skip carries on: x, or h = ``norm_in(x)`` with ``normed_skip`` (HybridNorm's FFN)."""
        return h if self.normed_skip else x

    def add(
        self,
        carry: torch.Tensor,
        h: torch.Tensor,
        context: tuple,
        skip: torch.Tensor | None,
        keep: torch.Tensor | None,
    ) -> torch.Tensor:
        """``norm_out(alpha * carry + update(h) [+ skip])``: the sum and the norm that may close it."""
        y = carry if self.alpha == 1.0 else carry * self.alpha
        y = y + self.update(h, context, keep)
        y = y if skip is None else y + skip
        return self.norm_out(y, keep) if self.out_reads else self.norm_out(y)
