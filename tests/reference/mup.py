"""Run microsoft/mup's own classification and MuAdamW on normlab's model; write what tests/test_parametrization.py
compares ``training.mup.lr_factors`` with.

    pip install --no-deps mup==1.0.0    # the package the paper's authors publish (microsoft/mup, MIT licence)
    python -m tests.reference.mup [--out tests/expected/mup_official.json]

``--no-deps``: mup imports torch and pyyaml only (its package metadata also asks for torchvision, seaborn and pandas,
which its coordinate-check plots use, not this). Nothing of it is copied into normlab. Per case (a model config at
width D and its base width D_0): ``mup.set_base_shapes(model, base, delta=<the model at 2 D_0>,
rescale_params=False, do_assert=False)`` gives each parameter its ``infshape``, and ``mup.MuAdamW`` over all
parameters at lr 1 and weight decay 1 gives each its group's lr and weight decay, the factors muP puts on them.
Written per case and parameter name: the number of grown dimensions (``ninf``) and those two factors.
"""

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from model.config import ModelConfig
from model.norm_config import NormConfig
from model.transformer import EncoderDecoder
from training.mup import base_config

OUT = Path(__file__).resolve().parents[2] / "tests" / "expected" / "mup_official.json"
# The default model (tied embeddings, sinusoidal positions) at twice its base width, and an untied one with learned
# positions, a QK-norm and the elementwise output gate, at four times.
CASES = {
    "default": ModelConfig(src_vocab=30, tgt_vocab=40, parametrization="mup", base_d_model=64),
    "untied": ModelConfig(
        src_vocab=30,
        tgt_vocab=40,
        d_model=256,
        d_ff=1024,
        tie_embeddings=False,
        positions="learned",
        attn_gate="elementwise",
        norm=NormConfig(qk="layernorm"),
        parametrization="mup",
        base_d_model=64,
    ),
}


def official(cfg: ModelConfig) -> dict[str, dict[str, Any]]:
    """Parameter name -> ``{"ninf", "lr", "weight_decay"}`` as mup gives them for ``cfg``'s model."""
    import mup  # the official package, installed for this script only

    model, base = EncoderDecoder(cfg), EncoderDecoder(base_config(cfg))
    base0 = base_config(cfg)
    delta = EncoderDecoder(dataclasses.replace(base0, d_model=2 * base0.d_model, d_ff=2 * base0.d_ff))
    # do_assert=False: mup asserts that the readout is its MuReadout class; normlab's readout is a plain nn.Linear whose
    # multiplier the model applies (model.parametrization), and its LR factor is the one the test treats apart
    mup.set_base_shapes(model, base, delta=delta, rescale_params=False, do_assert=False)
    opt = mup.MuAdamW(model.parameters(), lr=1.0, weight_decay=1.0)
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    return {
        name: {"ninf": p.infshape.ninf(), "lr": group_of[id(p)]["lr"], "weight_decay": group_of[id(p)]["weight_decay"]}
        for name, p in model.named_parameters()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    written = {
        name: {"d_model": cfg.d_model, "base_d_model": cfg.base_d_model, "params": official(cfg)} for name, cfg in CASES.items()
    }
    args.out.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
