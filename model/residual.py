"""Residual connections with the norm at a chosen placement.

x is the residual stream (B, T, D); F is the sublayer (attention or FFN); N is the chosen norm.

- ``post`` (post-LN, Vaswani et al. 2017, sec. 5.4): ``x <- N(x + F(x))``
- ``pre`` (pre-LN, Xiong et al. 2020, arXiv 2002.04745, Fig. 1b): ``x <- x + F(N(x))``
- ``sandwich`` (CogView, Ding et al. 2021; Peri-LN, Kim et al. 2025, arXiv 2502.02732):
  ``x <- x + N2(F(N1(x)))``
- ``deepnorm`` (DeepNet, Wang et al. 2022, arXiv 2203.00555, Fig. 2): ``x <- N(alpha * x + F(x))``
  with the FFN, value and output projections initialized Xavier-normal with gain beta.

Dropout acts on the branch output, after N2 for sandwich. A stack ends with one more N iff its
placement leaves the stream un-normalized (``FINAL_NORM``). Each norm slot a placement leaves
empty is an ``nn.Identity``, so module paths (and telemetry names) are stable across placements.
"""

from typing import TYPE_CHECKING

import torch
from torch import nn

from model.norms import build_norm

if TYPE_CHECKING:  # config.py validates placements with this module, so import it lazily
    from model.config import NormConfig

PLACEMENTS = ("post", "pre", "sandwich", "deepnorm")

# A stack ends with a norm iff its placement leaves the residual stream un-normalized.
# Post-LN gets no extra final norm (torch.nn.Transformer adds one; normlab does not).
FINAL_NORM = {"post": False, "pre": True, "sandwich": True, "deepnorm": False}

# Norm slots (norm_in, norm_branch, norm_out) each placement fills.
SLOTS = {
    "post": (False, False, True),
    "pre": (True, False, False),
    "sandwich": (True, True, False),
    "deepnorm": (False, False, True),
}

# Kinds that only make sense at some placements. DyT bounds its output to |weight| + |bias|:
# as the last op of a block (post, deepnorm) it would clip the whole residual stream.
KIND_PLACEMENTS = {"dyt": ("pre", "sandwich")}


def check_placement(placement: str, kind: str) -> None:
    """Raise ``ValueError`` naming the value and the valid ones for an unknown placement or a
    (kind, placement) combination that is not meaningful."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown norm.placement {placement!r}; valid placements: {', '.join(PLACEMENTS)}")
    allowed = KIND_PLACEMENTS.get(kind, PLACEMENTS)
    if placement not in allowed:
        raise ValueError(f"norm.kind={kind!r} cannot be used with norm.placement={placement!r}; valid placements for it: "
                         f"{', '.join(allowed)}")  # fmt: skip


def deepnorm_constants(n_enc_layers: int, n_dec_layers: int) -> dict[str, tuple[float, float]]:
    """DeepNet's (alpha, beta) for an encoder-decoder with N encoder and M decoder layers.

    Wang et al. 2022, Table 1 (encoder-decoder row): encoder alpha = 0.81 (N^4 M)^(1/16),
    beta = 0.87 (N^4 M)^(-1/16); decoder alpha = (3M)^(1/4), beta = (12M)^(-1/4). The paper's
    0.87 is used for the encoder beta; the reference code (torchscale) uses 1.15 there.

    Returns:
        ``{"enc": (alpha, beta), "dec": (alpha, beta)}``.
    """
    n, m = n_enc_layers, n_dec_layers
    return {
        "enc": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),
        "dec": ((3 * m) ** (1 / 4), (12 * m) ** (-1 / 4)),
    }


def build_final_norm(norm: "NormConfig", d_model: int) -> nn.Module:
    """The norm that closes a stack of layers, or ``nn.Identity`` when the placement needs none."""
    if FINAL_NORM[norm.placement]:
        return build_norm(norm.kind, d_model, impl=norm.impl, eps=norm.eps, bias=norm.bias)
    return nn.Identity()


class Residual(nn.Module):
    """``x <- norm_out(alpha * x + dropout(norm_branch(branch(norm_in(x), *context))))``.

    Args:
        branch: the sublayer F; called as ``branch(normed_x, *context)``.
        norm: kind/impl/placement/eps/bias of the norm; the placement fills the slots.
        d_model: D.
        dropout: dropout probability on the branch output.
        alpha: residual scale (DeepNet's alpha; 1 for every other placement).

    Shapes: x (B, T, D) -> (B, T, D).
    """

    def __init__(self, branch: nn.Module, norm: "NormConfig", d_model: int, dropout: float, alpha: float = 1.0) -> None:
        super().__init__()
        check_placement(norm.placement, norm.kind)

        def slot(used: bool) -> nn.Module:
            return build_norm(norm.kind, d_model, impl=norm.impl, eps=norm.eps, bias=norm.bias) if used else nn.Identity()

        use_in, use_branch, use_out = SLOTS[norm.placement]
        self.alpha = alpha
        self.norm_in = slot(use_in)
        self.branch = branch
        self.norm_branch = slot(use_branch)
        self.dropout = nn.Dropout(dropout)
        self.norm_out = slot(use_out)

    def forward(self, x: torch.Tensor, *context: torch.Tensor | None) -> torch.Tensor:
        skip = x if self.alpha == 1.0 else x * self.alpha
        return self.norm_out(skip + self.dropout(self.norm_branch(self.branch(self.norm_in(x), *context))))
