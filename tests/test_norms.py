"""Custom norms match PyTorch's own modules and the published formulas."""

import copy

import pytest
import torch
from torch import nn

from model.config import NormSpec
from model.kinds import ATTENTION_ONLY_KINDS, BATCH_READING_KINDS, NORM_KINDS, NORM_PAIRS
from model.norms import build_norm
from model.placements import PLACEMENTS

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


def test_layernorm_constant_row_is_zero_not_nan_and_its_gradient_is_natives():
    # The centred row is 0, so the variance's ||xc|| is 0, where vector_norm's derivative is undefined (torch: 0).
    x, x2 = (torch.full((2, 16), 5.0, requires_grad=True) for _ in range(2))
    y = build_norm("layernorm", 16)(x)
    assert torch.equal(y, torch.zeros(2, 16))
    g = torch.randn(2, 16)
    y.backward(g)
    build_norm("layernorm", 16, impl="native")(x2).backward(g)
    torch.testing.assert_close(x.grad, x2.grad)  # (g - mean(g)) / sqrt(eps): finite, and native's


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


def test_dyisru_formula_by_hand():
    torch.manual_seed(0)
    D = 16
    norm = build_norm("dyisru", D)
    assert {n: tuple(p.shape) for n, p in norm.named_parameters()} == {"beta": (1,), "weight": (D,), "bias": (D,)}
    assert norm.beta.item() == D and torch.equal(norm.weight, torch.ones(D)) and torch.equal(norm.bias, torch.zeros(D))
    with torch.no_grad():
        norm.beta.fill_(3.0)
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(4, D) * 2
    want = norm.weight * D**0.5 * x / (3.0 + x**2).sqrt() + norm.bias
    torch.testing.assert_close(norm(x), want, atol=1e-5, rtol=0)
    assert [n for n, _ in build_norm("dyisru", D, bias=False).named_parameters()] == ["beta", "weight"]


def test_dyisru_at_init_is_close_to_rmsnorm_on_unit_rms_input():
    # With beta = D, element i is RMSNorm's x_i times (1 + x_i^2 / D)^(-1/2): a relative gap of at most
    # x_i^2 / (2D) (+ 1e-5 for RMSNorm's eps and float32). Over Gaussian rows that is about sqrt(E[x^6]) / (2D)
    # = sqrt(15) / (2D) in L2 (0.76% at D=256; measured 0.74%; the worst element, |x| = 4.4, is 3.6% off).
    torch.manual_seed(0)
    D = 256
    x = torch.randn(1000, D)
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()  # RMS exactly 1 per row
    y, rms = build_norm("dyisru", D)(x), build_norm("rmsnorm", D)(x)
    assert ((y - rms).abs() / rms.abs() <= x**2 / (2 * D) + 1e-5).all()
    assert (y - rms).norm() / rms.norm() <= 15**0.5 / (2 * D)


def test_dyisru_is_bounded_by_sqrt_d():
    D = 64
    x = torch.randn(8, D) * 1e4
    y = build_norm("dyisru", D)(x)
    assert y.abs().max() <= D**0.5
    assert y.abs().max() > 0.99 * D**0.5  # large inputs saturate at the bound, as tanh in DyT


@pytest.mark.parametrize("kind", ["dyisru", "derf"])
def test_bounded_kinds_are_rejected_where_the_norm_ends_the_block(kind):
    allowed = [name for name, p in PLACEMENTS.items() if p.admits(kind)]
    assert allowed == [name for name, p in PLACEMENTS.items() if p.admits("dyt")]  # the placements DyT is admitted by
    assert allowed[:2] == ["pre", "sandwich"] and "post" not in allowed and "deepnorm" not in allowed
    message = f"norm.kind='{kind}' cannot be used with norm.placement='post'; valid placements for it: {', '.join(allowed)}$"
    with pytest.raises(ValueError, match=message):
        NormSpec(kind=kind, placement="post")


def test_l2_has_unit_norm_and_is_built_at_attention_sites_only():
    x = torch.randn(3, 5, 8) * 7
    y = build_norm("l2", 8, attention=True)(x)
    torch.testing.assert_close(y, x / x.norm(dim=-1, keepdim=True), atol=1e-6, rtol=0)
    assert not list(build_norm("l2", 8, attention=True).parameters())
    assert torch.equal(build_norm("l2", 8, eps=1e-6, attention=True)(torch.zeros(2, 8)), torch.zeros(2, 8))  # not NaN


def test_none_is_identity():
    x = torch.randn(2, 8)
    assert torch.equal(build_norm("none", 8)(x), x)


# The batch-reading kinds' rows depend on each other by design: tests/test_batchnorm.py, tests/test_powernorm.py.
@pytest.mark.parametrize("kind", [k for k in NORM_KINDS if k not in BATCH_READING_KINDS])
def test_rows_are_independent(kind):
    norm = build_norm(kind, 32)
    x = torch.randn(5, 32)
    alone = norm(x[2:3])
    x[0] *= 1000.0
    torch.testing.assert_close(norm(x)[2:3], alone, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("kind", "impl"),
    [(k, "custom") for k in ("layernorm", "annotated_ln", "rmsnorm", "scalenorm", "dyisru", "seednorm", "l2")]
    + [("layernorm", "native")],
)
def test_low_precision_large_inputs_stay_finite_and_match_fp32(kind, impl, dtype):
    # x^2 of std-300 activations overflows fp16 (max 65504); stats must be taken in fp32.
    torch.manual_seed(0)
    x = torch.randn(8, 256) * 300
    attention = kind in ATTENTION_ONLY_KINDS
    ref = build_norm(kind, 256, impl=impl, attention=attention)(x.to(dtype).float())
    y = build_norm(kind, 256, impl=impl, attention=attention)(x.to(dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()
    # Not the zeros an fp16 x^2 overflow gives; l2's unit rows over 256 have mean |y| ~ sqrt(2 / pi) / 16 = 0.05.
    assert y.float().abs().mean() > (0.02 if attention else 0.5)
    tol = {torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]  # one ulp at 1.0
    torch.testing.assert_close(y.float(), ref, atol=4 * tol * ref.abs().max().item(), rtol=0)


@pytest.mark.parametrize(("kind", "impl"), sorted(NORM_PAIRS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_under_cpu_bf16_autocast_a_norm_computes_exactly_what_it_does_without(kind, impl, dtype):
    # trainer.precision=bf16 runs every norm inside autocast, on fp32 inputs (the residual stream) and bf16 ones (QK-norm
    # on a bf16 projection). Autocast must leave the float32 statistics alone: a statistic taken by an op autocast
    # lowers (a matmul, linalg.vecdot) would come out in bf16, which the fp32 reference here would show.
    torch.manual_seed(0)
    norm = build_norm(kind, 256, impl=impl, attention=kind in ATTENTION_ONLY_KINDS)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(0.1 * torch.randn_like(p))  # gains, shifts and DyT's alpha off their init, so each is in the output
    x = (torch.randn(2, 8, 256) * 300 + 50).to(dtype)  # large, off-centre: bf16 squares of these lose every digit
    args = (x, torch.ones(2, 8, dtype=torch.bool)) if kind in BATCH_READING_KINDS else (x,)
    twin = copy.deepcopy(norm)  # a batch-reading norm updates its running statistics in each training forward
    ref = norm(*args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = twin(*args)
    assert y.dtype == dtype and torch.equal(y, ref)


# The pairs a norm.kind may take, in record order: the attention-only l2/custom is not among them.
RESIDUAL_PAIRS = ", ".join(f"{k}/{i}" for k, i in NORM_PAIRS if k in NORM_KINDS)


@pytest.mark.parametrize("kind", ["layernorm", "annotated_ln", "rmsnorm", "scalenorm", "dyt", "dyisru", "seednorm", "derf"])
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
        "annotated_ln": lambda: w * xc / ((xc.pow(2).sum(-1, keepdim=True) / 31).sqrt() + norm.eps) + b,
        "rmsnorm": lambda: w * x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt(),
        "scalenorm": lambda: w * x / x.norm(dim=-1, keepdim=True),
        "dyt": lambda: w * torch.tanh(norm.alpha * x) + b,
        "derf": lambda: w * torch.erf(norm.alpha * x + norm.shift) + b,
        "dyisru": lambda: w * 32**0.5 * x / (norm.beta + x.pow(2)).sqrt() + b,
        "seednorm": lambda: (
            (torch.tanh(x @ norm.beta)[:, None] * norm.alpha + w) * x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        ),
    }[kind]()
    y = norm(x)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, ref, atol=1e-13, rtol=0)


@pytest.mark.parametrize(
    ("kind", "impl", "message"),
    [
        ("groupnorm", "custom", "unknown norm.kind 'groupnorm'; valid kinds: " + ", ".join(NORM_KINDS) + "$"),
        ("l2", "custom", "unknown norm.kind 'l2'; valid kinds: " + ", ".join(NORM_KINDS) + "$"),
        ("layernorm", "triton", "valid impls: custom, native"),
        ("scalenorm", "native", f"norm.kind='scalenorm' has no impl 'native'; valid kind/impl pairs: {RESIDUAL_PAIRS}$"),
    ],
)
def test_unknown_names_list_the_valid_ones(kind, impl, message):
    with pytest.raises(ValueError, match=message):
        build_norm(kind, 8, impl=impl)
