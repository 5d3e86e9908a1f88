"""muP's per-parameter Adam LR factors (``model.parametrization=mup``; the rules and their sources are in
``model.parametrization``), each parameter classified as microsoft/mup's ``set_base_shapes`` classifies it: by which
of its dimensions differ from the same parameter's in the base model (``infshape``; ``mup.optim.MuAdam`` scales a
parameter with two such dimensions, a hidden matrix, by 1 / its fan-in's multiplier). The token embeddings and the
readout get 1 / sqrt(m) instead, for the reason ``model.parametrization`` gives (normlab's sqrt(D) embedding factor).
``tests/test_parametrization.py`` compares the hidden matrices' factors with MuAdamW's on the same model. Under
``model.parametrization=completep`` the LRs are muP's (CompleteP's depth factor on them, m_L^(alpha - 1), is 1 at
alpha = 1) and the blocks' Adam eps gets 1 / (m * m_L) (:func:`eps_factors`)."""

import dataclasses
import math

import torch

from model.config import ModelConfig
from model.transformer import EncoderDecoder


def base_config(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` at its base width: d_model = ``base_d_model``, d_ff scaled alike (``ModelConfig`` checked that it is a
    whole number), the same heads and depth, so its width multiplier is 1."""
    base = cfg.base_d_model if cfg.base_d_model is not None else cfg.d_model
    return dataclasses.replace(cfg, d_model=base, d_ff=cfg.d_ff * base // cfg.d_model)


def lr_factors(model: EncoderDecoder) -> dict[int, float]:
    """``id(parameter)`` -> the factor on its Adam LR (its weight decay gets the inverse, so that AdamW's decay per step,
    lr * wd, is unchanged, as ``mup.optim.MuAdam`` does): 1 for every parameter under ``sp`` (or at the base width)."""
    m = model.cfg.width_mult
    if m == 1.0:
        return {id(p): 1.0 for p in model.parameters()}
    with torch.device("meta"):  # shapes only: nothing is allocated or drawn
        base = dict(EncoderDecoder(base_config(model.cfg)).named_parameters())
    readout = {id(model.src_embed.tokens.weight), id(model.tgt_embed.tokens.weight), id(model.output.weight)}
    factors = {}
    for name, p in model.named_parameters():
        grown = [i for i, (n, n0) in enumerate(zip(p.shape, base[name].shape, strict=True)) if n != n0]
        if id(p) in readout:
            factors[id(p)] = 1.0 / math.sqrt(m)
        elif len(grown) == 2:  # a hidden matrix (out, in): 1 / its fan-in's multiplier
            factors[id(p)] = base[name].shape[1] / p.shape[1]
        else:  # vector-like (one grown dimension: gains, biases, learned positions) or fixed: unchanged
            factors[id(p)] = 1.0
    return factors


def eps_factors(model: EncoderDecoder) -> dict[int, float]:
    """``id(parameter)`` -> the factor on its Adam eps: 1 / (m * m_L) for a parameter of a block of a stack with depth
    multiplier m_L under ``completep`` (Dey et al. 2025, Table 1, residual blocks; nanoGPT-mup's completep branch
    scales one eps, every parameter's, alike), 1 for the rest and for every parameter under ``sp`` and ``mup``."""
    factors = {id(p): 1.0 for p in model.parameters()}
    if model.cfg.parametrization == "completep":
        for stack, blocks in (("enc", model.encoder), ("dec", model.decoder)):
            factor = 1.0 / (model.cfg.width_mult * model.cfg.depth_mult(stack))
            factors |= {id(p): factor for p in blocks.parameters()}
    return factors
