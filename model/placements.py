"""Where the norm sits in a residual block: one frozen record per placement, in one table.

x is the residual stream (B, T, D); F is the sublayer (attention or FFN); N is the chosen norm.

- ``post`` (post-LN, Vaswani et al. 2017, sec. 5.4): ``x <- N(x + F(x))``
- ``pre`` (pre-LN, Xiong et al. 2020, arXiv 2002.04745, Fig. 1b): ``x <- x + F(N(x))``
- ``sandwich`` (CogView, Ding et al. 2021; Peri-LN, Kim et al. 2025, arXiv 2502.02732):
  ``x <- x + N2(F(N1(x)))``
- ``deepnorm`` (DeepNet, Wang et al. 2022, arXiv 2203.00555, Fig. 2): ``x <- N(alpha * x + F(x))``
  with the FFN, value and output projections initialized Xavier-normal with gain beta.

Everything a placement decides is in its :class:`Placement` record: which norm slots of
``model.residual.Residual`` it fills, whether a stack of its blocks ends with one more norm, the
residual scale, the init rule and the norm kinds it rejects. Nothing outside this module names
a placement: a new one is a new row of ``PLACEMENTS``.

Init rules pick matrices by *role*, not by parameter name: every module that owns block matrices
says which of its ``nn.Linear`` layers plays which role through ``linear_roles()``
(``attn.q``, ``attn.k``, ``attn.v``, ``attn.out``, ``ffn.in``, ``ffn.out``), so renaming an
attribute cannot silently change an init.
"""

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

STACKS = ("enc", "dec")


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


# A rule giving a number per stack: (stack, n_enc_layers, n_dec_layers) -> value.
StackRule = Callable[[str, int, int], float]


def unit_scale(stack: str, n_enc_layers: int, n_dec_layers: int) -> float:
    """The plain residual ``x + F(x)``: scale 1 in every stack."""
    return 1.0


@dataclass(frozen=True)
class XavierNormalInit:
    """Re-initialize every matrix of a block Xavier-normal: gain ``gain(stack, N, M)`` on the
    matrices playing one of ``roles``, gain 1 on the others (DeepNet's pseudocode, Wang et al.
    2022, Fig. 2: ``xavier_normal_(w, gain=beta)`` or ``gain=1``)."""

    roles: tuple[str, ...]
    gain: StackRule

    def apply(self, block: nn.Module, stack: str, n_enc_layers: int, n_dec_layers: int) -> None:
        """Re-initialize the 2-D parameters of ``block`` in ``block.parameters()`` order (so the
        RNG draws come in the same order as a loop over parameter names)."""
        gain = self.gain(stack, n_enc_layers, n_dec_layers)
        scaled = {
            id(linear.weight)
            for module in block.modules()
            if hasattr(module, "linear_roles")
            for role, linear in module.linear_roles().items()
            if role in self.roles
        }
        for p in block.parameters():
            if p.dim() == 2:
                nn.init.xavier_normal_(p, gain=gain if id(p) in scaled else 1.0)


@dataclass(frozen=True)
class Placement:
    """One placement of the norm in a residual block.

    Attributes:
        name: the ``norm.placement`` value.
        slots: which of (``norm_in``, ``norm_branch``, ``norm_out``) hold a norm; the others are
            ``nn.Identity``.
        final_norm: a stack of these blocks ends with one more norm: true iff the block leaves
            the residual stream un-normalized. Post-LN gets no extra final norm
            (``torch.nn.Transformer`` adds one; normlab does not).
        residual_scale: alpha in ``x <- norm_out(alpha * x + ...)``, per stack.
        init: re-initializes the block's matrices after the model's default init; None keeps it.
        rejects: norm kinds this placement does not admit.
    """

    name: str
    slots: tuple[bool, bool, bool]
    final_norm: bool
    residual_scale: StackRule = unit_scale
    init: XavierNormalInit | None = None
    rejects: tuple[str, ...] = ()

    def admits(self, kind: str) -> bool:
        """Whether norm kind ``kind`` may sit at this placement."""
        return kind not in self.rejects


# DyT bounds its output to |weight| + |bias|: as the last op of a block (post, deepnorm) it would
# clip the whole residual stream, so only placements that keep the stream un-normalized take it.
_BOUNDED = ("dyt",)

PLACEMENTS: dict[str, Placement] = {
    p.name: p
    for p in (
        Placement("post", slots=(False, False, True), final_norm=False, rejects=_BOUNDED),
        Placement("pre", slots=(True, False, False), final_norm=True),
        Placement("sandwich", slots=(True, True, False), final_norm=True),
        Placement(
            "deepnorm",
            slots=(False, False, True),
            final_norm=False,
            residual_scale=lambda stack, n, m: deepnorm_constants(n, m)[stack][0],
            init=XavierNormalInit(
                roles=("attn.v", "attn.out", "ffn.in", "ffn.out"),
                gain=lambda stack, n, m: deepnorm_constants(n, m)[stack][1],
            ),
            rejects=_BOUNDED,
        ),
    )
}


def check_placement(placement: str, kind: str) -> None:
    """Raise ``ValueError`` naming the value and the valid ones for an unknown placement or a
    (kind, placement) combination that is not meaningful."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown norm.placement {placement!r}; valid placements: {', '.join(PLACEMENTS)}")
    if not PLACEMENTS[placement].admits(kind):
        allowed = [name for name, p in PLACEMENTS.items() if p.admits(kind)]
        raise ValueError(f"norm.kind={kind!r} cannot be used with norm.placement={placement!r}; valid placements for it: "
                         f"{', '.join(allowed)}")  # fmt: skip
