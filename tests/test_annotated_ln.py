"""``norm.kind=annotated_ln``: the Annotated Transformer's LayerNorm (Rush 2018), unbiased std with eps on the std,
pinned against a hand computation and against ``nn.LayerNorm``; a tiny model trains with it."""

import pytest
import torch
from torch import nn

from model.config import ModelConfig, NormConfig
from model.norms import AnnotatedLayerNorm, build_norm
from model.transformer import EncoderDecoder
from tests.helpers.config import fit_losses, make_cfg, model_config


def test_formula_by_hand():
    # x = [1, 2, 3, 4]: mean 2.5, deviations [-1.5, -0.5, 0.5, 1.5], sum of squares 5, unbiased std sqrt(5 / 3).
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    std = (5 / 3) ** 0.5
    for eps in (1e-6, 0.5):  # 0.5: eps on the std (1.2910 + 0.5), not inside the square root (sqrt(5/3 + 0.5) = 1.4720)
        want = torch.tensor([[-1.5, -0.5, 0.5, 1.5]]) / (std + eps)
        torch.testing.assert_close(build_norm("annotated_ln", 4, eps=eps)(x), want, atol=1e-6, rtol=0)
    # eps 1e-6: [-1.1619, -0.3873, 0.3873, 1.1619], sqrt(3/4) of LayerNorm's [-1.3416, -0.4472, 0.4472, 1.3416]
    y = build_norm("annotated_ln", 4, eps=1e-6)(x)
    torch.testing.assert_close(y, torch.tensor([[-1.1619, -0.3873, 0.3873, 1.1619]]), atol=1e-4, rtol=0)


def test_affine_parameters_and_constant_rows():
    torch.manual_seed(0)
    norm = build_norm("annotated_ln", 8, eps=1e-3)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(3, 8) * 4 + 2
    xc = x - x.mean(-1, keepdim=True)
    want = norm.weight * xc / ((xc.pow(2).sum(-1, keepdim=True) / 7).sqrt() + 1e-3) + norm.bias
    torch.testing.assert_close(norm(x), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(norm(torch.full((2, 8), 5.0)), norm.bias.expand(2, 8), atol=0, rtol=0)  # 0 / eps, not NaN


@pytest.mark.parametrize("D", [4, 64, 256])
def test_it_is_sqrt_d_minus_1_over_d_of_nn_layernorm(D):
    # With eps negligible, std_unbiased = sqrt(D / (D - 1)) std_population: the output is sqrt((D - 1) / D) of
    # nn.LayerNorm's, 1 - 1/(2D) to first order: 13.4% smaller at D = 4, 0.78% at D = 64, 0.20% at D = 256.
    torch.manual_seed(0)
    x = torch.randn(16, D) * 3 + 1
    y, ln = build_norm("annotated_ln", D, eps=1e-9)(x), nn.LayerNorm(D, eps=1e-12)(x)
    torch.testing.assert_close(y, ((D - 1) / D) ** 0.5 * ln, atol=1e-5, rtol=0)  # values of |y| up to ~4: atol, not a ratio
    assert ((y - ln).norm() / ln.norm()).item() == pytest.approx(1 - ((D - 1) / D) ** 0.5, rel=1e-3)
    assert abs((1 - ((D - 1) / D) ** 0.5) - 1 / (2 * D)) < 1 / (2 * D) ** 2
    assert round(1 - (63 / 64) ** 0.5, 4) == 0.0078  # docs/norms.md's 0.78% at D = 64


def test_parameters_are_named_as_layernorms_so_a_state_dict_moves():
    norm, native = build_norm("annotated_ln", 16), nn.LayerNorm(16)
    assert {n: tuple(p.shape) for n, p in norm.named_parameters()} == {"weight": (16,), "bias": (16,)}
    norm.load_state_dict(native.state_dict())
    assert [n for n, _ in build_norm("annotated_ln", 16, bias=False).named_parameters()] == ["weight"]
    assert isinstance(build_norm("annotated_ln", 16), AnnotatedLayerNorm)


def test_one_feature_is_refused():
    with pytest.raises(ValueError, match=r"^norm.kind=annotated_ln needs D >= 2 features .*, got D=1$"):
        build_norm("annotated_ln", 1)


def test_native_is_refused_naming_the_valid_pairs():
    message = "norm.kind='annotated_ln' has no impl 'native'; valid kind/impl pairs: layernorm/custom"
    with pytest.raises(ValueError, match=message):
        model_config(make_cfg("norm.kind=annotated_ln", "norm.impl=native"), 12, 12)


def test_a_tiny_model_trains_with_it():
    cfg = model_config(make_cfg("norm.kind=annotated_ln", "norm.eps=1e-6"), 12, 12)
    assert (cfg.norm.kind, cfg.norm.placement) == ("annotated_ln", "pre")
    torch.manual_seed(0)
    model = EncoderDecoder(cfg)
    assert isinstance(model.encoder[0].self_attn.norm_in, AnnotatedLayerNorm)
    assert isinstance(model.dec_final_norm, AnnotatedLayerNorm) and model.dec_final_norm.eps == 1e-6
    src, tgt = torch.randint(4, 12, (8, 6)), torch.randint(4, 12, (8, 6))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = fit_losses(model, src, tgt, opt, 20)
    assert losses[0] > 2.0 and losses[-1] < 0.5 * losses[0], losses  # from about ln(12) = 2.48


def test_post_ln_takes_it_too():
    model = EncoderDecoder(ModelConfig(src_vocab=12, tgt_vocab=12, d_model=32, n_heads=4, d_ff=64,
                                       norm=NormConfig(kind="annotated_ln", placement="post")))  # fmt: skip
    assert isinstance(model.encoder[0].ffn.norm_out, AnnotatedLayerNorm) and isinstance(model.enc_final_norm, nn.Identity)
