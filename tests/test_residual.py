"""Placements: each computes its paper's formula; constants, init and module paths as promised."""

import math

import pytest
import torch
from torch import nn

from model import EncoderDecoder, ModelConfig, NormConfig
from model.residual import FINAL_NORM, PLACEMENTS, Residual, deepnorm_constants

D = 16


def ln(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.layer_norm(x, (D,), eps=1e-5)


@pytest.mark.parametrize(
    ("placement", "formula"),
    [
        ("post", lambda x, f, a: ln(x + f(x))),
        ("pre", lambda x, f, a: x + f(ln(x))),
        ("sandwich", lambda x, f, a: x + ln(f(ln(x)))),
        ("deepnorm", lambda x, f, a: ln(a * x + f(x))),
    ],
)
def test_each_placement_computes_its_formula(placement, formula):
    torch.manual_seed(0)
    branch = nn.Linear(D, D)
    alpha = 1.7 if placement == "deepnorm" else 1.0
    residual = Residual(branch, NormConfig(placement=placement), D, dropout=0.0, alpha=alpha)
    x = torch.randn(3, 5, D) * 4
    torch.testing.assert_close(residual(x), formula(x, branch, alpha), atol=1e-5, rtol=0)


def test_deepnorm_constants_for_6_plus_6_layers():
    c = deepnorm_constants(6, 6)
    assert c["enc"] == pytest.approx((1.418, 0.497), abs=1e-3)
    assert c["dec"] == pytest.approx((2.060, 0.343), abs=1e-3)


def make(placement: str, kind: str = "layernorm", n: int = 6) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=10, tgt_vocab=10, d_model=64, n_heads=4, d_ff=128, n_enc_layers=n, n_dec_layers=n,
                      norm=NormConfig(kind=kind, placement=placement))  # fmt: skip
    return EncoderDecoder(cfg)


def test_deepnorm_scales_residual_and_init():
    model = make("deepnorm")
    (enc_a, enc_b), (dec_a, dec_b) = deepnorm_constants(6, 6).values()
    assert model.encoder[0].ffn.alpha == pytest.approx(enc_a) and model.decoder[5].cross_attn.alpha == pytest.approx(dec_a)
    xavier_std = math.sqrt(2 / (64 + 64))
    v = torch.cat([layer.self_attn.branch.v_proj.weight.flatten() for layer in model.encoder])
    q = torch.cat([layer.self_attn.branch.q_proj.weight.flatten() for layer in model.encoder])
    assert v.std().item() == pytest.approx(enc_b * xavier_std, rel=0.05)
    assert q.std().item() == pytest.approx(xavier_std, rel=0.05)
    out = torch.cat([layer.ffn.branch.linear2.weight.flatten() for layer in model.decoder])
    assert out.std().item() == pytest.approx(dec_b * math.sqrt(2 / (128 + 64)), rel=0.05)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_final_norm_iff_stream_left_unnormalized(placement):
    model = make(placement, n=1)
    assert (not isinstance(model.enc_final_norm, nn.Identity)) == FINAL_NORM[placement]
    assert FINAL_NORM[placement] == (placement in ("pre", "sandwich"))


def test_module_paths_are_the_same_for_every_placement():
    names = {p: [n for n, _ in make(p, n=2).named_modules()] for p in PLACEMENTS}
    assert all(v == names["pre"] for v in names.values())


def test_sandwich_fills_input_and_branch_slots():
    residual = make("sandwich", n=1).encoder[0].ffn
    assert isinstance(residual.norm_out, nn.Identity)
    assert isinstance(residual.norm_in, nn.Module) and not isinstance(residual.norm_in, nn.Identity)
    assert not isinstance(residual.norm_branch, nn.Identity)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"placement": "middle"}, "unknown norm.placement 'middle'; valid placements: post, pre, sandwich, deepnorm"),
        (
            {"kind": "dyt", "placement": "post"},
            "norm.kind='dyt' cannot be used with norm.placement='post'; valid placements for it: pre, sandwich",
        ),
        ({"kind": "scalenorm", "impl": "native"}, "has no impl 'native'"),
    ],
)
def test_impossible_combinations_fail_at_config_time(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NormConfig(**kwargs)
