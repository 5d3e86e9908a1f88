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
"""

import math

PARAMETRIZATIONS = ("sp", "mup")
# Norm kinds whose own parameters muP's rules do not cover: refused under mup, each with the reason.
UNRULED_KINDS = {
    "seednorm": "its beta reads the whole width into one number per token, a readout without muP's multiplier",
    "dyisru": "its beta starts at d_model, a scalar whose size grows with the width",
    "scalenorm": "its g starts at sqrt(d_model), a scalar whose size grows with the width",
}


def width_mult(parametrization: str, d_model: int, base_d_model: int | None) -> float:
    """m = d_model / base_d_model under ``mup``; 1.0 under ``sp``."""
    return d_model / base_d_model if parametrization == "mup" and base_d_model is not None else 1.0


def logit_factor(m: float) -> float:
    """The factor on the attention logits q.k / sqrt(K) and on the output logits: 1 / sqrt(m) (1.0 at m = 1)."""
    return 1.0 if m == 1.0 else 1.0 / math.sqrt(m)


def check(parametrization: str, d_model: int, d_ff: int, n_heads: int, base_d_model: int | None) -> str | None:
    """The reason the widths cannot be a muP model of ``base_d_model`` (None: they can); ``sp`` takes any.

    The base model has d_ff * base_d_model / d_model FFN units and the same heads, so both must be whole numbers."""
    if parametrization not in PARAMETRIZATIONS:
        return f"unknown model.parametrization {parametrization!r}; valid: {', '.join(PARAMETRIZATIONS)}"
    if parametrization == "sp":
        if base_d_model is not None:
            return f"model.base_d_model={base_d_model} is muP's base width: set model.parametrization=mup, or base_d_model=null"
        return None
    if isinstance(base_d_model, bool) or not isinstance(base_d_model, int) or base_d_model < 1:
        return f"model.parametrization=mup needs model.base_d_model, a positive integer (the base width), got {base_d_model!r}"
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
