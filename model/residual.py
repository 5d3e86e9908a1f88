"""Residual connections with the norm at a chosen placement.

x is the residual stream (B, T, D); F is the sublayer (attention or FFN) followed by dropout;
N is the chosen norm.

- ``post`` (post-LN, Vaswani et al. 2017, sec. 5.4 / Fig. 1): ``x <- N(x + F(x))``
- ``pre``  (pre-LN, Xiong et al. 2020, arXiv 2002.04745, Fig. 1b): ``x <- x + F(N(x))``, and the
  stack ends with one more N (see ``FINAL_NORM``).

Each norm slot that a placement leaves empty is an ``nn.Identity``, so module paths (and the
telemetry names built from them) are the same for every placement.
"""

from typing import TYPE_CHECKING

import torch
from torch import nn

from model.norms import build_norm

if TYPE_CHECKING:  # config.py validates placements with this module, so import it lazily
    from model.config import NormConfig

PLACEMENTS = ("post", "pre")

# A stack ends with a norm iff its placement leaves the residual stream un-normalized.
# Post-LN gets no extra final norm (torch.nn.Transformer adds one; normlab does not).
FINAL_NORM = {"post": False, "pre": True}


def check_placement(placement: str) -> None:
    """Raise ``ValueError`` naming ``placement`` and the valid ones if it is unknown."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown norm.placement {placement!r}; valid placements: {', '.join(PLACEMENTS)}")


def build_final_norm(norm: "NormConfig", d_model: int) -> nn.Module:
    """The norm that closes a stack of layers: a norm for ``pre``, ``nn.Identity`` for ``post``."""
    if FINAL_NORM[norm.placement]:
        return build_norm(norm.kind, d_model, impl=norm.impl, eps=norm.eps)
    return nn.Identity()


class Residual(nn.Module):
    """``x <- norm_out(x + dropout(branch(norm_in(x, ...))))`` with the slots set by the placement.

    Args:
        branch: the sublayer F; called as ``branch(normed_x, *context)``.
        norm: kind/impl/placement/eps of the norm.
        d_model: D.
        dropout: dropout probability applied to the branch output before the addition.

    Shapes: x (B, T, D) -> (B, T, D).
    """

    def __init__(self, branch: nn.Module, norm: "NormConfig", d_model: int, dropout: float) -> None:
        super().__init__()
        check_placement(norm.placement)

        def slot(used: bool) -> nn.Module:
            return build_norm(norm.kind, d_model, impl=norm.impl, eps=norm.eps) if used else nn.Identity()

        self.norm_in = slot(norm.placement == "pre")
        self.branch = branch
        self.dropout = nn.Dropout(dropout)
        self.norm_out = slot(norm.placement == "post")

    def forward(self, x: torch.Tensor, *context: torch.Tensor | None) -> torch.Tensor:
        return self.norm_out(x + self.dropout(self.branch(self.norm_in(x), *context)))
