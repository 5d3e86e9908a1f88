"""Placements: each computes its paper's formula; constants, init and module paths as promised."""

import math

import pytest
import torch
from torch import nn

from model.config import ModelConfig, NormConfig
from model.norms import build_norm
from model.placements import PLACEMENTS, ResidualPlan, deepnorm_constants
from model.residual import Residual
from model.transformer import EncoderDecoder

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
    plan = ResidualPlan(PLACEMENTS[placement].slots, alpha=alpha)
    residual = Residual(branch, plan, lambda: build_norm("layernorm", D), dropout=0.0, dim=D)
    x = torch.randn(3, 5, D) * 4
    torch.testing.assert_close(residual(x), formula(x, branch, alpha), atol=1e-5, rtol=0)


# The constants table of docs/norms.md: layers per stack, (enc alpha, enc beta), (dec alpha, dec beta),
# and torchscale's encoder beta, 1.15 (N^4 M)^(-1/16) (architecture/encoder.py) where the paper has 0.87.
@pytest.mark.parametrize(
    ("n", "enc", "dec", "torchscale_enc_beta"),
    [(2, (1.006, 0.701), (1.565, 0.452), 0.926), (3, (1.142, 0.617), (1.732, 0.408), 0.816),
     (6, (1.418, 0.497), (2.060, 0.343), 0.657)],
)  # fmt: skip
def test_deepnorm_constants_table(n, enc, dec, torchscale_enc_beta):
    c = deepnorm_constants(n, n)
    assert c["enc"] == pytest.approx(enc, abs=1e-3)
    assert c["dec"] == pytest.approx(dec, abs=1e-3)
    assert c["enc"][1] * 1.15 / 0.87 == pytest.approx(torchscale_enc_beta, abs=1e-3)


def norm_for(placement: str, kind: str = "layernorm") -> NormConfig:
    """The norm config of ``placement``: no norm kind where it takes none, q/k/v norms where it needs them."""
    if not PLACEMENTS[placement].admits(kind):
        kind = "none"
    qkv = "layernorm" if PLACEMENTS[placement].needs_qkv_norm else None
    return NormConfig(kind=kind, placement=placement, qk=qkv, v=qkv)


def make(placement: str, kind: str = "layernorm", n: int = 6) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=10, tgt_vocab=10, d_model=64, n_heads=4, d_ff=128, n_enc_layers=n, n_dec_layers=n,
                      norm=norm_for(placement, kind))  # fmt: skip
    return EncoderDecoder(cfg)


# torchscale (microsoft/torchscale, architecture/encoder.py and decoder.py) divides exactly these
# by 1/beta, in every attention of both stacks (cross-attention included); q and k keep their init.
REFERENCE_SCALED = ("v_proj", "out_proj", "linear1", "linear2")  # torchscale: v_proj, out_proj, fc1, fc2


def test_deepnorm_scales_residual_and_the_reference_matrices():
    model = make("deepnorm")
    constants = deepnorm_constants(6, 6)
    assert model.encoder[0].ffn.alpha == pytest.approx(constants["enc"][0])
    assert model.decoder[5].cross_attn.alpha == pytest.approx(constants["dec"][0])
    for stack, layers in (("enc", model.encoder), ("dec", model.decoder)):
        beta = constants[stack][1]
        for name, p in layers.named_parameters():
            if p.dim() == 2:
                scaled = name.split(".")[-2] in REFERENCE_SCALED
                xavier_std = math.sqrt(2 / sum(p.shape))
                assert p.std().item() == pytest.approx((beta if scaled else 1.0) * xavier_std, rel=0.06), name


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_final_norm_iff_stream_left_unnormalized(placement):
    model = make(placement, n=1)
    assert (not isinstance(model.enc_final_norm, nn.Identity)) == PLACEMENTS[placement].final_norm
    unnormalized = ("pre", "sandwich", "lns", "mix_ln", "hybrid", "hybrid_star", "res_post", "layerscale")
    assert PLACEMENTS[placement].final_norm == (placement in unnormalized)


def test_module_paths_are_the_same_for_every_placement():
    # remove_duplicate=False: ReZero's gate is one module at two paths of a block (shared, like a tied weight)
    names = {p: [n for n, _ in make(p, n=2).named_modules(remove_duplicate=False)] for p in PLACEMENTS}
    assert all(v == names["pre"] for v in names.values())


def test_sandwich_fills_input_and_branch_slots():
    residual = make("sandwich", n=1).encoder[0].ffn
    assert isinstance(residual.norm_out, nn.Identity)
    assert isinstance(residual.norm_in, nn.Module) and not isinstance(residual.norm_in, nn.Identity)
    assert not isinstance(residual.norm_branch, nn.Identity)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"placement": "middle"},
            "unknown norm.placement 'middle'; valid placements: post, pre, sandwich, deepnorm, lns, "
            "mix_ln, hybrid, hybrid_star, res_post, admin, keel, b2t, rezero, layerscale, tfixup",
        ),
        (
            {"kind": "dyt", "placement": "post"},
            "norm.kind='dyt' cannot be used with norm.placement='post'; "
            "valid placements for it: pre, sandwich, lns, res_post, layerscale",
        ),
        ({"kind": "scalenorm", "impl": "native"}, "has no impl 'native'"),
    ],
)
def test_impossible_combinations_fail_at_config_time(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NormConfig(**kwargs)
