"""Custom norms match PyTorch's own modules and the published formulas."""

import pytest
import torch
from torch import nn

from model.norms import NORM_KINDS, build_norm


@pytest.mark.parametrize("kind", NORM_KINDS)
def test_custom_matches_native_forward_and_backward(kind):
    torch.manual_seed(0)
    custom, native = build_norm(kind, 64, impl="custom"), build_norm(kind, 64, impl="native")
    # Non-trivial affine parameters, the same in both (state dicts are interchangeable).
    with torch.no_grad():
        for p in custom.parameters():
            p.normal_()
    native.load_state_dict(custom.state_dict())
    x = (torch.randn(4, 7, 64) * 3 + 1).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y, y2 = custom(x), native(x2)
    torch.testing.assert_close(y, y2, atol=1e-5, rtol=0)
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-5, rtol=0)
    for (n1, p1), (n2, p2) in zip(custom.named_parameters(), native.named_parameters(), strict=True):
        assert n1 == n2
        torch.testing.assert_close(p1.grad, p2.grad, atol=1e-5, rtol=0)


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


@pytest.mark.parametrize("kind", NORM_KINDS)
def test_rows_are_independent(kind):
    norm = build_norm(kind, 32)
    x = torch.randn(5, 32)
    alone = norm(x[2:3])
    x[0] *= 1000.0
    torch.testing.assert_close(norm(x)[2:3], alone, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", NORM_KINDS)
def test_custom_low_precision_large_inputs_stay_finite(kind, dtype):
    # x^2 of std-300 activations overflows fp16 (max 65504); stats must be taken in fp32.
    x = torch.randn(8, 256) * 300
    ref = build_norm(kind, 256)(x)
    y = build_norm(kind, 256)(x.to(dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), ref, atol=0.05, rtol=0.02)


@pytest.mark.parametrize(
    ("kind", "impl", "message"),
    [
        ("batchnorm", "custom", "valid kinds: layernorm, rmsnorm"),
        ("layernorm", "triton", "valid impls: custom, native"),
    ],
)
def test_unknown_names_list_the_valid_ones(kind, impl, message):
    with pytest.raises(ValueError, match=message):
        build_norm(kind, 8, impl=impl)
