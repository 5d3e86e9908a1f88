"""Residual connections with the norm at a chosen placement (``model.placements``).

x is the residual stream (B, T, D); F is the sublayer (attention or FFN); N is the chosen norm.
One block computes ``x <- norm_out(alpha * x + dropout(norm_branch(F(norm_in(x)))))``; its
placement record says which slots hold a norm and what alpha is.

Dropout acts on the branch output, after N2 for sandwich. Each norm slot a placement leaves
empty is an ``nn.Identity``, so module paths (and telemetry names) are stable across placements.
"""

from collections.abc import Callable

import torch
from torch import nn

from model.placements import Placement


class Residual(nn.Module):
    """``x <- norm_out(alpha * x + dropout(norm_branch(branch(norm_in(x), *context))))``.

    Args:
        branch: the sublayer F; called as ``branch(normed_x, *context)``.
        placement: fills the slots ``norm_in``, ``norm_branch``, ``norm_out`` it names.
        make_norm: builds one norm over D (called once per filled slot); the placement already
            admitted its kind.
        dropout: dropout probability on the branch output.
        alpha: residual scale (the placement's ``residual_scale``; 1 for most).

    Shapes: x (B, T, D) -> (B, T, D).
    """

    def __init__(
        self, branch: nn.Module, placement: Placement, make_norm: Callable[[], nn.Module], dropout: float, alpha: float = 1.0
    ) -> None:
        super().__init__()

        def slot(used: bool) -> nn.Module:
            return make_norm() if used else nn.Identity()

        use_in, use_branch, use_out = placement.slots
        self.alpha = alpha
        self.norm_in = slot(use_in)
        self.branch = branch
        self.norm_branch = slot(use_branch)
        self.dropout = nn.Dropout(dropout)
        self.norm_out = slot(use_out)

    def forward(self, x: torch.Tensor, *context: torch.Tensor | None) -> torch.Tensor:
        skip = x if self.alpha == 1.0 else x * self.alpha
        return self.norm_out(skip + self.dropout(self.norm_branch(self.branch(self.norm_in(x), *context))))
