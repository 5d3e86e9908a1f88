"""Hyper-connections: n residual streams, read and written by each sublayer through learned mixing weights.

Shape legend: B batch, L length, n streams (``model.residual_streams``), D d_model. The streams travel between
blocks flattened as (B, L, n*D), stream k at ``[..., k*D:(k+1)*D]``, so a stack's blocks (and the telemetry
taps on them) see one (B, L, features) tensor; at n = 1 that is the plain (B, L, D) stream.

One sublayer with input streams H (n, D) per token, its pre-LN update ``u(h) = dropout(F(N(h)))``
(``model.hyper_residual.HyperResidual``), width weights a_m (n,), residual matrix A (n, n) and depth weights b (n,):

    h0 = sum_k a_m[k] H_k        (the sublayer's input)
    H'_j = b_j u(h0) + sum_k A[k, j] H_k      i.e. H' = b u(h0)^T + A^T H

``norm.hc`` picks how the weights are made:

- ``static`` (Zhu et al. 2025, "Hyper-Connections", ICLR, arXiv 2409.19606, eqs. 1-5): learned a_m, A, b;
  init eq. 14: a_m = e_{k mod n} for the stack's k-th sublayer, A = I, b = 1, so at n = 1 the sublayer is
  exactly pre-LN's ``x + u(x)``.
- ``dynamic`` (ibid., eqs. 10-13): the static ones plus ``s_a tanh(norm(H) W_a)`` on [a_m | A] (W_a (D, 1+n)) and
  ``s_b tanh(norm(H) W_b)`` on b (W_b (D,)), per stream; W zero-initialized and s = 0.01 (the paper's
  Algorithm 2 as lucidrains/hyper-connections writes it); norm is a LayerNorm over D (the paper's).
- ``mhc`` (Xie et al. 2025, "mHC: Manifold-Constrained Hyper-Connections", arXiv 2512.24880, eqs. 7-8, as
  Hugging Face transformers 5.23.0's ``DeepseekV4HyperConnection`` computes it, the reference here): from the
  RMS-normalized flattened streams x' (n*D,), in float32, ``[p, q, r] = x' phi^T`` with phi ((2+n) n, n*D);
  a_m = sigmoid(alpha_pre p + b_pre) + eps, b = 2 sigmoid(alpha_post q + b_post), A = Sinkhorn-Knopp of
  softmax_rows(alpha_res r + b_res) + eps (``sinkhorn``): doubly stochastic, so the residual path neither
  grows nor shrinks the streams' sum. Init as ``DeepseekV4PreTrainedModel._init_weights``: phi ~ N(0, 0.02),
  biases 0, alphas 1.

At the stack's end the streams become one (B, L, D) before the final norm: summed (HC paper, sec. 2.1) for
``static``/``dynamic``; for ``mhc`` weighted by sigmoid(alpha x' phi_head^T + b) + eps (``DeepseekV4HyperHead``).
Implementations differ in details: docs/norms.md, "Hyper-connections".
"""

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from model.kinds import HC_KINDS
from model.norms import build_norm

DYNAMIC_SCALE_INIT = 0.01  # s_a, s_b of dynamic HC (lucidrains/hyper-connections, Algorithm 2 of the paper)
SINKHORN_ITERS = 20  # mHC t_max (Xie et al. sec. 4.1; DeepseekV4Config.hc_sinkhorn_iters)
MHC_EPS = 1e-6  # DeepseekV4Config.hc_eps: added to a_m and to A before Sinkhorn, and to each normalizer
MHC_RMS_EPS = 1e-6  # DeepseekV4Config.rms_norm_eps, of the unweighted RMSNorm on the flattened streams
MHC_INIT_STD = 0.02  # DeepseekV4Config.initializer_range, the std of phi at init


def _float32_region(device: torch.device) -> AbstractContextManager:
    """Autocast off, so the mixing weights are computed in float32 under a bf16 run; a no-op on a device autocast does
    not know (``meta``, where ``scripts/estimate_time.py`` counts FLOPs: ``torch.autocast("meta")`` raises)."""
    return torch.autocast(device.type, enabled=False) if torch.amp.is_autocast_available(device.type) else nullcontext()


Update = Callable[[torch.Tensor], torch.Tensor]


def sinkhorn(m: torch.Tensor, iters: int = SINKHORN_ITERS, eps: float = MHC_EPS) -> torch.Tensor:
    """Sinkhorn-Knopp as ``DeepseekV4HyperConnection``: columns normalized first, then ``iters - 1`` rounds of
    rows then columns, each sum + ``eps``; so the columns sum to 1 to ~eps, the rows nearly.
    (Sinkhorn & Knopp 1967; mHC eq. 9 starts from exp(.) and alternates rows first.) m (..., n, n) positive.

    Computed on a contiguous (n, n, ...) copy, so that each sum adds n contiguous vectors instead of reducing n
    strided elements per token: the same additions in the same order, so equal outputs (tested)."""
    m = m.movedim((-2, -1), (0, 1)).contiguous()  # (n, n, ...): rows index 0, columns index 1
    m = m / (m.sum(0, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(1, keepdim=True) + eps)
        m = m / (m.sum(0, keepdim=True) + eps)
    return m.movedim((0, 1), (-2, -1)).contiguous()  # a strided (..., n, n) view would make A^T H's bmm copy per token


def _unweighted_rms(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, in float32 (``DeepseekV4UnweightedRMSNorm``)."""
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + MHC_RMS_EPS)


class HyperConnection(nn.Module):
    """Static or dynamic hyper-connections around one sublayer (HC paper eqs. 1-5, 10-14; module docstring).

    Args:
        n: streams. d_model: D. sublayer: the 0-based index k of this sublayer in its stack (a_m = e_{k mod n}).
        dynamic: add the input-dependent terms. eps: of the dynamic weights' LayerNorm.

    Shapes: streams (B, L, n*D) -> (B, L, n*D); ``update`` maps (B, L, D) -> (B, L, D).
    """

    def __init__(self, n: int, d_model: int, sublayer: int, *, dynamic: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.n = n
        width = torch.zeros(n, 1)
        width[sublayer % n] = 1.0
        self.static_alpha = nn.Parameter(torch.cat([width, torch.eye(n)], dim=1))  # [a_m | A]: (n, 1+n)
        self.static_beta = nn.Parameter(torch.ones(n))  # b: (n,)
        self.dynamic = dynamic
        if dynamic:
            self.norm = build_norm("layernorm", d_model, eps=eps)
            self.alpha_fn = nn.Parameter(torch.zeros(d_model, 1 + n))  # W_a
            self.alpha_scale = nn.Parameter(torch.tensor(DYNAMIC_SCALE_INIT))  # s_a
            self.beta_fn = nn.Parameter(torch.zeros(d_model))  # W_b
            self.beta_scale = nn.Parameter(torch.tensor(DYNAMIC_SCALE_INIT))  # s_b

    def weights(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([a_m | A] (..., n, 1+n), b (..., n)) for the streams h (B, L, n, D); static: the parameters."""
        if not self.dynamic:
            return self.static_alpha, self.static_beta
        normed = self.norm(h)
        alpha = self.static_alpha + self.alpha_scale * torch.tanh(normed @ self.alpha_fn)
        return alpha, self.static_beta + self.beta_scale * torch.tanh(normed @ self.beta_fn)

    def residual_matrix(self, streams: torch.Tensor) -> torch.Tensor:
        """A, the residual mixing (as in H' = A^T H + ...): (n, n) static, (B, L, n, n) dynamic."""
        return self.weights(streams.unflatten(-1, (self.n, -1)))[0][..., 1:]

    def forward(self, streams: torch.Tensor, update: Update) -> torch.Tensor:
        h = streams.unflatten(-1, (self.n, -1))  # (B, L, n, D)
        alpha, beta = self.weights(h)
        mixed = torch.einsum("...st,...sd->...td", alpha, h)  # (B, L, 1+n, D): h0, then A^T H
        out = mixed[..., 1:, :] + beta[..., None] * update(mixed[..., 0, :])[..., None, :]
        return out.flatten(-2)


class ManifoldHyperConnection(nn.Module):
    """mHC around one sublayer, as ``DeepseekV4HyperConnection`` (module docstring). Weights in float32, mixing in
    the streams' dtype. Shapes: streams (B, L, n*D) -> (B, L, n*D); ``update`` (B, L, D) -> (B, L, D)."""

    def __init__(self, n: int, d_model: int) -> None:
        super().__init__()
        self.n = n
        self.fn = nn.Parameter(torch.randn((2 + n) * n, n * d_model) * MHC_INIT_STD)  # phi = [phi_pre; phi_post; phi_res]
        self.base = nn.Parameter(torch.zeros((2 + n) * n))  # [b_pre, b_post, b_res]
        self.scale = nn.Parameter(torch.ones(3))  # alpha_pre, alpha_post, alpha_res

    def weights(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a_m (B, L, n), b (B, L, n), A (B, L, n, n)) in float32 for streams (B, L, n*D)."""
        n = self.n
        with _float32_region(streams.device):
            proj = F.linear(_unweighted_rms(streams), self.fn.float())
            pre, post, res = (
                w * s + b
                for w, s, b in zip(
                    proj.split([n, n, n * n], -1), self.scale.float(), self.base.float().split([n, n, n * n]), strict=True
                )
            )
            res = torch.softmax(res.unflatten(-1, (n, n)), dim=-1) + MHC_EPS
            return torch.sigmoid(pre) + MHC_EPS, 2 * torch.sigmoid(post), sinkhorn(res)

    def residual_matrix(self, streams: torch.Tensor) -> torch.Tensor:
        """A (B, L, n, n), the residual mixing (H' = A^T H + ...)."""
        return self.weights(streams)[2]

    def forward(self, streams: torch.Tensor, update: Update) -> torch.Tensor:
        h = streams.unflatten(-1, (self.n, -1))  # (B, L, n, D)
        pre, post, res = self.weights(streams)
        f = update((pre[..., None] * h).sum(-2).to(h.dtype))  # (B, L, D); collapsed in float32, as the reference
        post, res = post.to(h.dtype), res.to(h.dtype)
        return (post[..., None] * f[..., None, :] + res.transpose(-1, -2) @ h).flatten(-2)


class StreamSum(nn.Module):
    """The streams summed into one (HC paper sec. 2.1): (B, L, n*D) -> (B, L, D)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        return streams.unflatten(-1, (self.n, -1)).sum(-2)


class ManifoldHead(nn.Module):
    """mHC's last merge, as ``DeepseekV4HyperHead``: sum_k (sigmoid(alpha (x' phi^T)_k + b_k) + eps) H_k, x' the
    RMS-normalized flattened streams, in float32; init phi ~ N(0, 0.02), b = 0, alpha = 1. (B, L, n*D) -> (B, L, D)."""

    def __init__(self, n: int, d_model: int) -> None:
        super().__init__()
        self.n = n
        self.fn = nn.Parameter(torch.randn(n, n * d_model) * MHC_INIT_STD)
        self.base = nn.Parameter(torch.zeros(n))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        with _float32_region(streams.device):
            pre = torch.sigmoid(F.linear(_unweighted_rms(streams), self.fn.float()) * self.scale.float() + self.base.float())
        h = streams.unflatten(-1, (self.n, -1))
        return ((pre + MHC_EPS)[..., None] * h).sum(-2).to(streams.dtype)


HC_MODULES = (HyperConnection, ManifoldHyperConnection, ManifoldHead)  # initialized by themselves, not the model's rule


def hyper_connection(kind: str, n: int, d_model: int, sublayer: int, eps: float) -> nn.Module:
    """The ``norm.hc`` module around the stack's ``sublayer``-th sublayer (0-based); raises ValueError for an
    unknown kind."""
    if kind == "mhc":
        return ManifoldHyperConnection(n, d_model)
    if kind in ("static", "dynamic"):
        return HyperConnection(n, d_model, sublayer, dynamic=kind == "dynamic", eps=eps)
    raise ValueError(f"unknown norm.hc {kind!r}; valid: null (off), {', '.join(HC_KINDS)}")


def stream_merge(kind: str, n: int, d_model: int) -> nn.Module:
    """The module that ends a stack's streams: ``ManifoldHead`` for mhc, else ``StreamSum``."""
    return ManifoldHead(n, d_model) if kind == "mhc" else StreamSum(n)


def composite_gain(matrices: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """mHC's "Amax Gain Magnitude" (Xie et al. sec. 3.1, Fig. 3) of a stack's residual path: with each sublayer's
    A (..., n, n) acting as H' = A^T H, the composite map M = A_L^T ... A_1^T; returns (max_i sum_j |M_ij|, the
    forward signal gain, and max_j sum_i |M_ij|, the backward gradient gain), each (...,). Doubly stochastic A: 1, 1."""
    m = matrices[0].transpose(-1, -2)
    for a in matrices[1:]:
        m = a.transpose(-1, -2) @ m
    return m.abs().sum(-1).amax(-1), m.abs().sum(-2).amax(-1)
