"""SeeDNorm (Cai et al. 2025, ICLR 2026, arXiv 2510.22777), experimental: no official code was found, so the
formula ``[tanh(x . beta) * alpha + gamma] * x / RMS(x)`` with alpha, beta, gamma in R^(1 x D) is from the paper,
and the init (gamma 1, alpha 1, beta 0) is normlab's (model/norms.py, docs/norms.md)."""

import math

import pytest
import torch

from model.norms import RMSNorm, SeeDNorm, build_norm

D = 8


def perturbed(norm: SeeDNorm, seed: int = 0) -> SeeDNorm:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return norm


def test_seednorm_formula_by_hand():
    norm = SeeDNorm(4, eps=1e-5).double()
    with torch.no_grad():
        norm.beta.copy_(torch.tensor([0.1, 0.2, -0.1, 0.4], dtype=torch.float64))
        norm.alpha.copy_(torch.tensor([0.5, -1.0, 2.0, 0.25], dtype=torch.float64))
        norm.weight.copy_(torch.tensor([1.0, 0.5, 1.5, 2.0], dtype=torch.float64))
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]], dtype=torch.float64)
    s = math.tanh(0.1 - 0.4 - 0.3 + 0.2)  # x . beta = -0.4: one scalar for the token
    assert s == pytest.approx(-0.379948962255225, abs=1e-15)
    rms = math.sqrt((1 + 4 + 9 + 0.25) / 4 + 1e-5)
    gain = [s * a + g for a, g in zip([0.5, -1.0, 2.0, 0.25], [1.0, 0.5, 1.5, 2.0], strict=True)]
    expected = [gi * xi / rms for gi, xi in zip(gain, [1.0, -2.0, 3.0, 0.5], strict=True)]
    assert norm(x)[0].tolist() == pytest.approx(expected, abs=1e-14)


def test_seednorm_is_rmsnorm_at_init_and_at_alpha_zero_for_any_beta():
    x = torch.randn(3, 5, D) * 4 + 1
    rms = RMSNorm(D, 1e-5)
    seed = SeeDNorm(D, 1e-5)
    assert seed.alpha.tolist() == [1.0] * D and seed.beta.tolist() == [0.0] * D and seed.weight.tolist() == [1.0] * D
    assert torch.equal(seed(x), rms(x))  # beta = 0: tanh(x . beta) = 0
    perturbed(seed)
    with torch.no_grad():
        seed.alpha.zero_()
        rms.weight.copy_(seed.weight)
    assert seed.beta.abs().sum() > 0 and torch.equal(seed(x), rms(x))


def test_the_dynamic_term_is_one_tanh_per_token_shared_by_its_channels():
    norm = perturbed(SeeDNorm(D, 1e-5))
    x = torch.randn(4, D)
    assert norm.alpha.shape == norm.beta.shape == norm.weight.shape == (D,)
    s = norm.dynamic(x)
    assert s.shape == (4, 1) and s.abs().max() < 1
    torch.testing.assert_close(s[:, 0], torch.tanh(x @ norm.beta))


def test_init_gradients_reach_beta_first_and_alpha_zero_beta_zero_would_never_learn():
    x, up = torch.randn(6, D), torch.randn(6, D)
    norm = SeeDNorm(D, 1e-5)
    (norm(x) * up).sum().backward()
    assert norm.beta.grad.abs().sum() > 0 and torch.equal(norm.alpha.grad, torch.zeros(D))
    stuck = SeeDNorm(D, 1e-5)
    with torch.no_grad():
        stuck.alpha.zero_()
    (stuck(x) * up).sum().backward()
    assert torch.equal(stuck.alpha.grad, torch.zeros(D)) and torch.equal(stuck.beta.grad, torch.zeros(D))


def test_seednorm_has_custom_impl_only_and_no_shift():
    assert not hasattr(build_norm("seednorm", D, bias=True), "bias")
    with pytest.raises(ValueError, match="norm.kind='seednorm' has no impl 'native'"):
        build_norm("seednorm", D, impl="native")
