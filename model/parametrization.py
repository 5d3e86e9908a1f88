"""How the model's multipliers scale with width: the standard parametrization (``sp``) or muP for Adam (``mup``).

muP (Yang et al. 2021, "Tensor Programs V", arXiv 2203.03466, Table 3, the Adam column; microsoft/mup, the code the
paper ships) makes the best hyperparameters of a model of width D those of a narrow base model of width D_0 by
scaling, with the width multiplier m = D / D_0:

- the hidden matrices' (both dimensions grow with D) Adam LR by 1 / m (their fan-in's multiplier), and their weight
  decay by m, so that AdamW's decay per step, lr * wd, is unchanged (``mup.optim.MuAdam``);
- the attention logits: q.k / K instead of q.k / sqrt(K) (``mup``'s ``attn_mult / d``; here
  sqrt(K_0) q.k / K with K_0 = D_0 / H, so that the base model is the standard one);
- the output logits: ``mup.MuReadout``'s 1 / m on a readout weight it rescales by sqrt(m) at init. Here the readout
  keeps its standard init and gets 1 / sqrt(m) on the logits and 1 / sqrt(m) on its Adam LR (and sqrt(m) on its
  decay): the same function and the same training as mup's (the pair W' = sqrt(m) W, Adam's update being invariant
  to the weight's scale up to its eps).

normlab's token embeddings are ``W * sqrt(D)`` with W ~ N(0, 1/D) (``model.transformer.Embedding``): an embedding
coordinate of order 1, as muP's input layer has, but an Adam step on W moves it by sqrt(D) times the LR, which mup's
rule for an embedding (LR unchanged: it knows no multiplier) would let grow with width. So W's Adam LR gets 1 / sqrt(m)
(decay sqrt(m)): the update of the embedding coordinate is then width-free, muP's rule for the input layer. The target
embedding tied to the readout (``model.tie_embeddings``) gets the same factor from both rules, so the tie needs no
choice. Learned positions (no multiplier) are drawn with sqrt(m) times the standard std, the base model's, and keep
their LR. Norm gains and biases, vector-like, keep theirs (mup's vector-like rule).

The base model is the same model at ``model.base_d_model`` with d_ff scaled alike and the same heads, so m is one
number, and at D = D_0 every factor is exactly 1: ``mup`` is ``sp`` (``tests/test_parametrization.py``).

``completep`` (Dey et al. 2025, "Don't be lazy: CompleteP enables compute-efficient deep transformers", arXiv
2505.01618, Table 1 with alpha = 1; EleutherAI/nanoGPT-mup, branch ``completep``, the code the paper ships) is
``mup`` and a depth rule against a base depth L_0 (``model.base_depth``), with the depth multiplier of a stack
m_L = L / L_0 (L its blocks; the encoder's and the decoder's streams each their own):

- each residual branch's output (self-attention, cross-attention, FFN) times 1 / m_L before it joins the stream;
- the Adam eps of a block's parameters times 1 / (m * m_L) (Table 1's residual blocks; the official code scales one
  eps for every parameter, the embeddings and final norm too);
- the LRs of the block's parameters times m_L^(alpha - 1) = 1: at alpha = 1, muP's LRs.

Its derivation is for the pre-LN stream x + F(N(x)) / m_L: ``completep`` admits the placements whose branch joins
an unnormalized stream at weight 1 (``COMPLETEP_PLACEMENTS``: pre-LN, sandwich, and OLMo 2's ``res_post``, x + N(F(x))).
A placement with a depth scaling of its own (DeepNorm, LNS, Admin, Keel, T-Fixup, ReZero, LayerScale, Mix-LN's post-LN
blocks) or a norm on the stream (post-LN, B2T, HybridNorm) is refused, and so is GPAS, a gate on the stream: composing
two depth rules is a rule neither paper gives. At L = L_0 and D = D_0 every factor is exactly 1: ``completep`` is
``sp``.
"""

import math

PARAMETRIZATIONS = ("sp", "mup", "completep")
# the placements whose branch joins an unnormalized stream at weight 1, with no depth scaling of their own
COMPLETEP_PLACEMENTS = ("pre", "sandwich", "res_post")
# Norm kinds whose own parameters muP's rules do not cover: refused under mup, each with the reason.
UNRULED_KINDS = {
    "seednorm": "its beta reads the whole width into one number per token, a readout without muP's multiplier",
    "dyisru": "its beta starts at d_model, a scalar whose size grows with the width",
    "scalenorm": "its g starts at sqrt(d_model), a scalar whose size grows with the width",
}


def width_mult(parametrization: str, d_model: int, base_d_model: int | None) -> float:
    """m = d_model / base_d_model under ``mup`` and ``completep``; 1.0 under ``sp``."""
    return d_model / base_d_model if parametrization != "sp" and base_d_model is not None else 1.0


def depth_mult(parametrization: str, n_layers: int, base_depth: int | None) -> float:
    """m_L = n_layers / base_depth, a stack's depth multiplier, under ``completep``; 1.0 otherwise."""
    return n_layers / base_depth if parametrization == "completep" and base_depth is not None else 1.0


def logit_factor(m: float) -> float:
    """The factor on the attention logits q.k / sqrt(K) and on the output logits: 1 / sqrt(m) (1.0 at m = 1)."""
    return 1.0 if m == 1.0 else 1.0 / math.sqrt(m)


def check(
    parametrization: str, d_model: int, d_ff: int, n_heads: int, base_d_model: int | None, base_depth: int | None = None
) -> str | None:
    """The reason the widths cannot be a muP model of ``base_d_model`` (None: they can); ``sp`` takes any, without a
    base; ``completep`` needs ``base_depth`` as well, which the others refuse.

    The base model has d_ff * base_d_model / d_model FFN units and the same heads, so both must be whole numbers."""
    if parametrization not in PARAMETRIZATIONS:
        return f"unknown model.parametrization {parametrization!r}; valid: {', '.join(PARAMETRIZATIONS)}"
    if parametrization != "completep" and base_depth is not None:
        return f"model.base_depth={base_depth} is CompleteP's base depth: set model.parametrization=completep, or base_depth=null"
    if parametrization == "sp":
        if base_d_model is not None:
            return f"model.base_d_model={base_d_model} is muP's base width: set model.parametrization=mup, or base_d_model=null"
        return None
    if isinstance(base_d_model, bool) or not isinstance(base_d_model, int) or base_d_model < 1:
        return (
            f"model.parametrization={parametrization} needs model.base_d_model, a positive integer (the base width), "
            f"got {base_d_model!r}"
        )
    if parametrization == "completep" and (isinstance(base_depth, bool) or not isinstance(base_depth, int) or base_depth < 1):
        return (
            "model.parametrization=completep needs model.base_depth, a positive integer (the base model's blocks per "
            f"stack), got {base_depth!r}"
        )
    if base_d_model % n_heads:
        return (
            f"model.base_d_model={base_d_model} is not divisible by model.n_heads={n_heads} (the base model's heads); "
            f"valid: multiples of {n_heads}"
        )
    if (d_ff * base_d_model) % d_model:
        return (
            f"model.d_ff={d_ff} does not scale to the base width: d_ff * base_d_model / d_model = "
            f"{d_ff * base_d_model / d_model:g} FFN units; choose widths with a whole number"
        )
    return None
