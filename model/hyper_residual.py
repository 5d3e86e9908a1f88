"""A sublayer inside hyper-connections (``norm.hc``; the weights: ``model.hyper_connections``).

The hyper-connection reads the sublayer's input from the n residual streams and writes the sublayer's update back
to them, in place of the plain ``x + update``; the update is the placement plan's (``model.residual.Sublayer``).
``model.layers`` builds it in place of ``Residual`` for every sublayer when ``norm.hc`` is set.
"""

from collections.abc import Callable

import torch
from torch import nn

from model.placements import ResidualPlan
from model.residual import Gate, Sublayer


class HyperResidual(Sublayer):
    """``H <- hc(H, u)``, u(h) = ``update(norm_in(h))`` (``Sublayer.update``): the hyper-connection mixes the
    streams H and adds u of their mix (Zhu et al. 2025, arXiv 2409.19606, eqs. 1-5; mHC: Xie et al. 2025,
    arXiv 2512.24880, eqs. 7-8; ``model.hyper_connections``).

    Args (after ``Sublayer``'s):
        hc: the hyper-connection (``model.hyper_connections.hyper_connection``), called as ``hc(streams, u)``.

    Raises:
        ValueError: a plan with a ``norm_out``, alpha other than 1 or a normed skip: each acts on the plain sum
            ``x + update``, which the hyper-connection replaces (``ModelConfig`` admits only such plans with
            ``norm.hc``).

    Shapes: x (B, T, n*D), the n streams flattened (``model.hyper_connections``) -> (B, T, n*D).
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
        hc: nn.Module,
    ) -> None:
        if plan.slots[2] or plan.alpha != 1.0 or plan.normed_skip:
            raise ValueError(
                "a hyper-connection replaces the sum x + update: its plan must have no norm_out, alpha 1 "
                f"and no normed skip, got slots={plan.slots}, alpha={plan.alpha}, "
                f"normed_skip={plan.normed_skip}"
            )
        super().__init__(branch, plan, make_norm, dropout, dim, gate)
        self.hc = hc

    def forward(
        self,
        x: torch.Tensor,
        *context: torch.Tensor | None,
        skip: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``keep`` as ``Residual.forward``; ``skip`` must be None (raises ValueError otherwise): B2T's block skip
        has no place among the streams, and the config admits no placement with one alongside ``norm.hc``."""
        if skip is not None:
            raise ValueError("a hyper-connection takes no block skip (B2T)")
        return self.hc(x, lambda h: self.update(self.normalize_in(h, keep), context, keep))
