"""Custom norms match PyTorch's own modules and the published formulas."""

import pytest
import torch
from torch import nn

from model.norms import NORM_KINDS, build_norm

WITH_NATIVE = [("layernorm", True), ("layernorm", False), ("rmsnorm", True)]  # (kind, bias)


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to the scale of b."""
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize(("kind", "bias"), WITH_NATIVE)
def test_custom_matches_native_forward_and_backward(kind, bias):
    torch.manual_seed(0)
    custom, native = build_norm(kind, 64, impl="custom", bias=bias), build_norm(kind, 64, impl="native", bias=bias)
    # Non-trivial affine parameters, the same in both (state dicts are interchangeable).
    with torch.no_grad():
        for p in custom.parameters():
            p.normal_()
    native.load_state_dict(custom.state_dict())
    x = (torch.randn(4, 7, 64) * 3 + 1).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y, y2 = custom(x), native(x2)
    assert max_rel_diff(y, y2) < 1e-6
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    assert max_rel_diff(x.grad, x2.grad) < 1e-6
    for (n1, p1), (n2, p2) in zip(custom.named_parameters(), native.named_parameters(), strict=True):
        assert n1 == n2 and p1.shape == p2.shape
        assert max_rel_diff(p1.grad, p2.grad) < 1e-6


def test_native_modules_are_pytorchs():
    assert isinstance(build_norm("layernorm", 8, impl="native"), nn.LayerNorm)
    rms = build_norm("rmsnorm", 8, impl="native", eps=1e-6)
    assert isinstance(rms, nn.RMSNorm) and rms.eps == 1e-6  # eps passed, not nn.RMSNorm's default None


def test_layernorm_reference_values():
    y = build_norm("layernorm", 4)(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    torch.testing.assert_close(y, torch.tensor([[-1.3416, -0.4472, 0.4472, 1.3416]]), atol=1e-4, rtol=0)


def test_rmsnorm_reference_values():
    # mean(x^2) = 7.5 for [1, 2, 3, 4]
    y = build_norm("rmsnorm", 4, eps=0.0 + 1e-12)(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    torch.testing.assert_close(y, torch.tensor([[1.0, 2.0, 3.0, 4.0]]) / 7.5**0.5, atol=1e-6, rtol=0)


def test_layernorm_constant_row_is_zero_not_nan():
    y = build_norm("layernorm", 16)(torch.full((2, 16), 5.0))
    assert torch.equal(y, torch.zeros(2, 16))


def test_layernorm_output_is_invariant_to_positive_row_scaling():
    norm = build_norm("layernorm", 16, eps=1e-12)  # eps is the only thing that breaks the invariance
    x = torch.randn(3, 16)
    torch.testing.assert_close(norm(x * 37.0), norm(x), atol=1e-5, rtol=0)


def test_layernorm_without_bias_has_no_bias():
    assert [n for n, _ in build_norm("layernorm", 8, bias=False).named_parameters()] == ["weight"]


def test_scalenorm_starts_at_unit_rms_with_one_scalar_gain():
    norm = build_norm("scalenorm", 64)
    assert [tuple(p.shape) for p in norm.parameters()] == [(1,)]
    y = norm(torch.randn(5, 64) * 40)
    torch.testing.assert_close(y.pow(2).mean(-1).sqrt(), torch.ones(5), atol=1e-5, rtol=0)


def test_dyt_is_tanh_of_half_x_at_init():
    x = torch.randn(4, 16) * 3
    torch.testing.assert_close(build_norm("dyt", 16)(x), torch.tanh(0.5 * x), atol=1e-6, rtol=0)
    assert {n for n, _ in build_norm("dyt", 16).named_parameters()} == {"alpha", "weight", "bias"}


def test_none_is_identity():
    x = torch.randn(2, 8)
    assert torch.equal(build_norm("none", 8)(x), x)


@pytest.mark.parametrize("kind", NORM_KINDS)
def test_rows_are_independent(kind):
    norm = build_norm(kind, 32)
    x = torch.randn(5, 32)
    alone = norm(x[2:3])
    x[0] *= 1000.0
    torch.testing.assert_close(norm(x)[2:3], alone, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("kind", "impl"), [(k, "custom") for k in ("layernorm", "rmsnorm", "scalenorm")] + [("layernorm", "native")]
)
def test_low_precision_large_inputs_stay_finite_and_match_fp32(kind, impl, dtype):
    # x^2 of std-300 activations overflows fp16 (max 65504); stats must be taken in fp32.
    torch.manual_seed(0)
    x = torch.randn(8, 256) * 300
    ref = build_norm(kind, 256, impl=impl)(x.to(dtype).float())
    y = build_norm(kind, 256, impl=impl)(x.to(dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()
    assert y.float().abs().mean() > 0.5  # not the all-zeros an fp16 x^2 overflow gives
    tol = {torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]  # one ulp at 1.0
    torch.testing.assert_close(y.float(), ref, atol=4 * tol * ref.abs().max().item(), rtol=0)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "scalenorm", "dyt"])
def test_float64_is_computed_in_float64(kind):
    # The float32 statistics are for half precision only: narrowing float64 to float32 would cap a
    # float64 model at ~1e-7 (tests/test_preln_prerms.py needs 1e-10). Reference: the formula in float64.
    torch.manual_seed(0)
    norm = build_norm(kind, 32).double()
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn_like(p))
    w, b = norm.weight, getattr(norm, "bias", None)
    x = torch.randn(6, 32, dtype=torch.float64) * 3 + 1
    xc = x - x.mean(-1, keepdim=True)
    ref = {
        "layernorm": lambda: w * xc / (xc.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() + b,
        "rmsnorm": lambda: w * x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt(),
        "scalenorm": lambda: w * x / x.norm(dim=-1, keepdim=True),
        "dyt": lambda: w * torch.tanh(norm.alpha * x) + b,
    }[kind]()
    y = norm(x)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, ref, atol=1e-13, rtol=0)


@pytest.mark.parametrize(
    ("kind", "impl", "message"),
    [
        ("batchnorm", "custom", "valid kinds: layernorm, rmsnorm, scalenorm, dyt, none"),
        ("layernorm", "triton", "valid impls: custom, native"),
        ("scalenorm", "native", "norm.kind='scalenorm' has no impl 'native'; valid kind/impl pairs: layernorm/custom"),
    ],
)
def test_unknown_names_list_the_valid_ones(kind, impl, message):
    with pytest.raises(ValueError, match=message):
        build_norm(kind, 8, impl=impl)
