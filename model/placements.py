"""Where the norm sits in a residual block: one frozen record per placement, in one table.

x is the residual stream (B, T, D); F is the sublayer (attention or FFN); N is the chosen norm.

- ``post`` (post-LN, Vaswani et al. 2017, sec. 5.4): ``x <- N(x + F(x))``
- ``pre`` (pre-LN, Xiong et al. 2020, arXiv 2002.04745, Fig. 1b): ``x <- x + F(N(x))``
- ``sandwich`` (CogView, Ding et al. 2021; Peri-LN, Kim et al. 2025, arXiv 2502.02732):
  ``x <- x + N2(F(N1(x)))``
- ``deepnorm`` (DeepNet, Wang et al. 2022, arXiv 2203.00555, Fig. 2): ``x <- N(alpha * x + F(x))``
  with the FFN, value and output projections initialized Xavier-normal with gain beta.

The 2023-2026 variants (formulas, constants and sources: docs/norms.md, "Placements"): ``lns``
(LayerNorm Scaling), ``mix_ln``, ``hybrid`` / ``hybrid_star`` (HybridNorm), ``res_post`` (output
norm), ``admin`` and ``keel`` (scaled post-LN, like ``deepnorm``), ``b2t``, ``rezero``,
``layerscale``, ``tfixup``.

Everything a placement decides is in its :class:`Placement` record: which norm slots of
``model.residual.Residual`` it fills, whether a stack of its blocks ends with one more norm, the
residual scale, the init rule, the norm kinds it rejects, and the rarer knobs of the newer
variants (a scale on the input norm, a learned gate on the branch, a skip over the whole block,
another placement per depth). Nothing outside this module names
a placement: a new one is a new row of ``PLACEMENTS``.

Init rules pick matrices by *role*, not by parameter name: every module that owns block matrices
says which of its ``nn.Linear`` layers plays which role through ``linear_roles()``
(``attn.q``, ``attn.k``, ``attn.v``, ``attn.out``, ``ffn.in``, ``ffn.out``), so renaming an
attribute cannot silently change an init.

The table is torch-free (torch loads only where an init rule is applied), so a run's config is
checked against it before torch loads (``training.schema``).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from model.kinds import NORM_KINDS, kinds_where

if TYPE_CHECKING:
    from torch import nn


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


def residual_sublayers(stack: str, n_enc_layers: int, n_dec_layers: int) -> int:
    """The residual sublayers of a stack: 2 per encoder layer (self-attention, FFN), 3 per decoder
    layer (self-attention, cross-attention, FFN). Admin's N_r as admin-torch counts it (its
    docstring: "n-layer Transformer encoder has 2n residual layers"; the original Admin code,
    Transformer-Clinic, counts 3 per decoder layer), and Keel's alpha = L, "the total number of
    sub-layers" (Chen & Wei 2026, arXiv 2601.19895)."""
    return 2 * n_enc_layers if stack == "enc" else 3 * n_dec_layers


def admin_omega(n_res: int, output_change: str = "O(logn)") -> float:
    """Admin's closed-form skip weight omega for N_r residual sublayers (Liu et al. 2020, "Understanding
    the Difficulty of Training Transformers", arXiv 2004.08249, sec. 4.3; admin-torch's
    ``calculate_init``): ``sqrt((N_r + 1) / ln(N_r + 1) - 1)`` for an O(log N) output change (the
    package's default), ``sqrt(N_r)`` for O(1).

    Raises:
        ValueError: an unknown ``output_change`` (valid: ``O(logn)``, ``O(1)``).
    """
    if output_change == "O(logn)":
        return math.sqrt((n_res + 1) / math.log(n_res + 1) - 1)
    if output_change == "O(1)":
        return math.sqrt(n_res)
    raise ValueError(f"unknown Admin output_change {output_change!r}; valid: O(logn), O(1)")


def tfixup_scale(stack: str, n_enc_layers: int, n_dec_layers: int) -> float:
    """T-Fixup's factor on the value, output and FFN matrices of a stack (Huang et al. 2020,
    "Improving Transformer Optimization Through Better Initialization", ICML, sec. 3.2):
    decoder (9M)^(-1/4), encoder 0.67 N^(-1/4)."""
    return 0.67 * n_enc_layers ** (-1 / 4) if stack == "enc" else (9 * n_dec_layers) ** (-1 / 4)


def lns_factor(layer: int, n_layers: int) -> float:
    """LayerNorm Scaling's factor on a block's input norms (and on a cross-attention's memory, the other norm
    output it reads: ``model.residual.Residual``): 1 / sqrt(l), l the 1-based block index (Sun et al. 2025,
    "The Curse of Depth in Large Language Models", arXiv 2502.05795, eq. 8)."""
    return layer**-0.5


def layerscale_init(layer: int, n_layers: int) -> float:
    """LayerScale's initial lambda for a stack of L blocks (Touvron et al. 2021, CaiT, arXiv 2103.17239,
    sec. 2.2): 0.1 up to 18 blocks, 1e-5 up to 24, 1e-6 deeper."""
    return 0.1 if n_layers <= 18 else 1e-5 if n_layers <= 24 else 1e-6


def mix_ln_post_blocks(n_layers: int, alpha: float) -> int:
    """How many leading blocks of an L-block stack Mix-LN makes post-LN: floor(alpha * L) (Li et al.
    2025, "Mix-LN", ICLR, sec. 3); the rest are pre-LN."""
    return math.floor(alpha * n_layers)


# A rule giving a number per stack: (stack, n_enc_layers, n_dec_layers) -> value.
StackRule = Callable[[str, int, int], float]
# A rule giving a number per block: (l, L) -> value, l the 1-based block index, L the blocks in its stack.
LayerRule = Callable[[int, int], float]
Slots = tuple[bool, bool, bool]  # (norm_in, norm_branch, norm_out) filled


def unit_scale(stack: str, n_enc_layers: int, n_dec_layers: int) -> float:
    """The plain residual ``x + F(x)``: scale 1 in every stack."""
    return 1.0


def _matrices(block: "nn.Module", roles: tuple[str, ...]) -> set[int]:
    """ids of the weights of ``block``'s linear layers that play one of ``roles``."""
    return {
        id(linear.weight)
        for module in block.modules()
        if hasattr(module, "linear_roles")
        for role, linear in module.linear_roles().items()
        if role in roles
    }


@dataclass(frozen=True)
class XavierNormalInit:
    """Re-initialize every matrix of a block Xavier-normal: gain ``gain(stack, N, M)`` on the
    matrices playing one of ``roles``, gain 1 on the others (DeepNet's pseudocode, Wang et al.
    2022, Fig. 2: ``xavier_normal_(w, gain=beta)`` or ``gain=1``)."""

    roles: tuple[str, ...]
    gain: StackRule

    def apply(self, block: "nn.Module", stack: str, n_enc_layers: int, n_dec_layers: int) -> None:
        """Re-initialize the 2-D parameters of ``block`` in ``block.parameters()`` order (so the
        RNG draws come in the same order as a loop over parameter names)."""
        from torch import nn

        gain = self.gain(stack, n_enc_layers, n_dec_layers)
        scaled = _matrices(block, self.roles)
        for p in block.parameters():
            if p.dim() == 2:
                nn.init.xavier_normal_(p, gain=gain if id(p) in scaled else 1.0)


@dataclass(frozen=True)
class ScaleInit:
    """Multiply the matrices playing one of ``roles`` by ``factor(stack, N, M)``, keeping the default
    init's draws (T-Fixup scales its Xavier init, Huang et al. 2020, sec. 3.2)."""

    roles: tuple[str, ...]
    factor: StackRule

    def apply(self, block: "nn.Module", stack: str, n_enc_layers: int, n_dec_layers: int) -> None:
        """Scale the chosen matrices of ``block`` in place."""
        import torch

        factor = self.factor(stack, n_enc_layers, n_dec_layers)
        scaled = _matrices(block, self.roles)
        with torch.no_grad():
            for p in block.parameters():
                if id(p) in scaled:
                    p.mul_(factor)


@dataclass(frozen=True)
class GateRule:
    """A learned scale g on the branch output, ``x <- x + g * F(...)``: one scalar, or one per
    channel (diag(lambda)), starting at ``init(l, L)``; ``shared``: one gate for all the sublayers
    of a block (ReZero's official code shares its ``resweight``), else one per sublayer."""

    per_channel: bool
    init: LayerRule
    shared: bool = False


@dataclass(frozen=True)
class ResidualPlan:
    """What one residual sublayer builds (``model.residual.Residual``), resolved from its block's
    placement record and depth: the filled slots, alpha on the skip, a factor on the ``norm_in``
    output (and a cross-attention's memory), whether the skip starts from the ``norm_in`` output, the branch gate as
    (per_channel, initial value) or None, and a fixed factor on the branch output (``branch_scale``: CompleteP's
    1 / m_L, set by ``model.layers`` from the model's parametrization, not by a placement)."""

    slots: Slots
    alpha: float = 1.0
    in_scale: float = 1.0
    normed_skip: bool = False
    gate: tuple[bool, float] | None = None
    branch_scale: float = 1.0


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
        attn_slots: the attention sublayers' slots where they differ from ``slots`` (HybridNorm).
        normed_skip: the skip starts from the ``norm_in`` output, ``x <- N(x) + F(N(x))``, in the
            sublayers that fill ``norm_in`` (HybridNorm's FFN).
        needs_qkv_norm: the block's attentions must normalize q, k and v (``norm.qk``, ``norm.v``).
        in_scale: a factor on the ``norm_in`` output and a cross-attention's memory per block, (l, L) -> value
            (LayerNorm Scaling).
        gate: a learned scale on every branch output (ReZero, LayerScale); None: none.
        block_skip: the block input is added once more before the block's last norm (B2T).
        embed_scale: a factor on the stack's token embedding at init, per stack (T-Fixup); taken
            from the record of the stack's first block.
        by_depth: this placement is another one per block: (0-based index, L, the block's spec)
            -> a placement name (Mix-LN, HybridNorm*); the other fields then go unused.
    """

    name: str
    slots: Slots
    final_norm: bool
    residual_scale: StackRule = unit_scale
    init: XavierNormalInit | ScaleInit | None = None
    rejects: tuple[str, ...] = ()
    attn_slots: Slots | None = None
    normed_skip: bool = False
    needs_qkv_norm: bool = False
    in_scale: LayerRule | None = None
    gate: GateRule | None = None
    block_skip: bool = False
    embed_scale: StackRule | None = None
    by_depth: Callable[[int, int, Any], str] | None = None

    def admits(self, kind: str) -> bool:
        """Whether norm kind ``kind`` may sit at this placement."""
        return kind not in self.rejects

    def plan(self, attention: bool, stack: str, index: int, n_enc_layers: int, n_dec_layers: int) -> ResidualPlan:
        """The :class:`ResidualPlan` of one sublayer (an attention when ``attention``) of block
        ``index`` (0-based) of ``stack``."""
        n_layers = n_enc_layers if stack == "enc" else n_dec_layers
        l = index + 1  # noqa: E741 (the papers' name)
        return ResidualPlan(
            slots=self.attn_slots if attention and self.attn_slots is not None else self.slots,
            alpha=self.residual_scale(stack, n_enc_layers, n_dec_layers),
            in_scale=1.0 if self.in_scale is None else self.in_scale(l, n_layers),
            normed_skip=self.normed_skip,
            gate=None if self.gate is None else (self.gate.per_channel, self.gate.init(l, n_layers)),
        )


# A bounded kind (DyT and Derf: |weight| + |bias|; DyISRU: |weight| sqrt(D) + |bias|) as the last op of a block
# (post, deepnorm) would clip the whole residual stream, so only placements that keep the stream un-normalized take it.
_BOUNDED = kinds_where(bounded=True)
_NORM_FREE = tuple(k for k in NORM_KINDS if k != "none")  # rejected by the placements with no norm at all
_POST, _PRE = (False, False, True), (True, False, False)
_ALL_ROLES = ("attn.q", "attn.k", "attn.v", "attn.out", "ffn.in", "ffn.out")

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
        Placement("lns", slots=_PRE, final_norm=True, in_scale=lns_factor),
        Placement(
            "mix_ln",
            slots=_PRE,
            final_norm=True,
            rejects=_BOUNDED,
            by_depth=lambda i, n, spec: "post" if i < mix_ln_post_blocks(n, spec.mix_ln_alpha) else "pre",
        ),
        Placement(
            "hybrid",
            slots=_PRE,
            attn_slots=(False, False, False),
            normed_skip=True,
            final_norm=True,
            needs_qkv_norm=True,
            rejects=_BOUNDED,
        ),
        Placement(
            "hybrid_star",
            slots=_PRE,
            final_norm=True,
            needs_qkv_norm=True,
            rejects=_BOUNDED,
            by_depth=lambda i, n, spec: "pre" if i == 0 else "hybrid",
        ),
        Placement("res_post", slots=(False, True, False), final_norm=True),
        Placement(
            "admin",
            slots=_POST,
            final_norm=False,
            residual_scale=lambda stack, n, m: admin_omega(residual_sublayers(stack, n, m)),
            rejects=_BOUNDED,
        ),
        Placement("keel", slots=(True, False, True), final_norm=False, residual_scale=residual_sublayers, rejects=_BOUNDED),
        Placement(
            "b2t",
            slots=_POST,
            final_norm=False,
            block_skip=True,
            init=ScaleInit(roles=_ALL_ROLES, factor=lambda stack, n, m: (n if stack == "enc" else m) ** -0.5),
            rejects=_BOUNDED,
        ),
        Placement(
            "rezero",
            slots=(False, False, False),
            final_norm=False,
            gate=GateRule(False, lambda layer, n: 0.0, shared=True),
            rejects=_NORM_FREE,
        ),
        Placement("layerscale", slots=_PRE, final_norm=True, gate=GateRule(True, layerscale_init)),
        Placement(
            "tfixup",
            slots=(False, False, False),
            final_norm=False,
            init=ScaleInit(roles=("attn.v", "attn.out", "ffn.in", "ffn.out"), factor=tfixup_scale),
            embed_scale=lambda stack, n, m: (9 * (n if stack == "enc" else m)) ** (-1 / 4),
            rejects=_NORM_FREE,
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
        raise ValueError(
            f"norm.kind={kind!r} cannot be used with norm.placement={placement!r}; valid placements for it: {', '.join(allowed)}"
        )
