"""PowerNorm (Shen et al. 2020, "PowerNorm: Rethinking Batch Normalization in Transformers", ICML,
arXiv 2003.07845), with the semantics of the official code: sIncerass/powernorm,
``fairseq/modules/norms/mask_powernorm.py`` (``MaskPowerNorm``, ``PowerFunction``, ``GroupScaling1D``).

Written from the paper's Algorithm 2 and a reading of that file, in normlab's layout: x (B, L, D),
``keep`` (B, L) bool True at real tokens, where the official module takes (T, B, C) and a padding mask
(True at pads). Where the paper and the official code differ, this module follows the code;
docs/norms.md ("powernorm") lists the constants with their source lines and every difference.
"""

import torch
from torch import nn

from model.batch_reading import BatchReadingNorm, wide

# GroupScaling1D's own default eps (mask_powernorm.py line 20): MaskPowerNorm builds it as
# ``GroupScaling1D(group_num=group_num)`` (line 123), so ``eps`` never reaches it.
GROUP_SCALING_EPS = 1e-5


def group_scale(x: torch.Tensor, group_num: int) -> torch.Tensor:
    """Each token's channels split into ``group_num`` equal groups, each group divided by the square root of
    its mean square plus ``GROUP_SCALING_EPS``: ``GroupScaling1D.forward`` (mask_powernorm.py lines 28-37), a
    per-token RMS scaling without weight that runs before the batch statistics. Not in the paper.

    Shapes: x (..., D) with D divisible by ``group_num`` -> (..., D).
    """
    xg = x.unflatten(-1, (group_num, x.shape[-1] // group_num))  # (..., G, D / G)
    moment2 = (xg * xg).mean(dim=-1, keepdim=True)  # (..., G, 1)
    return (xg / torch.sqrt(moment2 + GROUP_SCALING_EPS)).flatten(-2)


class _PowerFunction(torch.autograd.Function):
    """Forward and approximate backward of PowerNorm on the group-scaled x: ``PowerFunction``
    (mask_powernorm.py lines 43-95). Every tensor here is (B, L, D) or (D,), in one dtype; the buffers
    are updated in place."""

    @staticmethod
    def forward(ctx, x, weight, bias, keep, running_phi, ema_gz, step, warmup_iters, alpha_fwd, alpha_bkw, eps):
        var = x[keep].pow(2).mean(dim=0)  # (D,) the quadratic mean over real tokens (line 56)
        # The batch's statistic up to and including iteration warmup_iters, then the running one from before this
        # update (lines 59-62). torch.where on the step tensor: no host sync.
        phi = torch.where(step <= warmup_iters, var, running_phi.to(var.dtype))
        z = x / (phi + eps).sqrt()
        # Before warmup_iters a cumulative mean of the batch statistics, then every iteration the EMA on top of it
        # (lines 67-69): at step 1 running_phi is exactly var.
        cumulative = running_phi * (step - 1) / step + var / step
        running_phi.copy_(torch.where(step < warmup_iters, cumulative, running_phi))
        running_phi.copy_(alpha_fwd * running_phi + (1 - alpha_fwd) * var)
        ctx.save_for_backward(z, var, weight)
        # The buffer itself, not a saved copy: the backward updates the module's EMA in place (line 91).
        ctx.ema_gz, ctx.alpha_bkw, ctx.eps, ctx.has_bias = ema_gz, alpha_bkw, eps, bias is not None
        y = weight * z
        return y if bias is None else y + bias

    @staticmethod
    def backward(ctx, grad_y):
        z, var, weight = ctx.saved_tensors
        ema_gz = ctx.ema_gz
        g = grad_y * weight  # dL/dz (line 85)
        # The paper's estimated gradient g - nu z with nu = (1 - alpha_bkw) * ema_gz (line 90); ema_gz then moves by
        # the mean of approx * z over every position of the batch, padded ones included (line 91), and the result is
        # divided by the batch's statistic even after warmup, when the forward used the running one (line 93).
        approx = g - (1 - ctx.alpha_bkw) * ema_gz.to(z.dtype) * z
        ema_gz.add_((approx * z).mean(dim=(0, 1)))
        grad_x = 1.0 / torch.sqrt(var + ctx.eps) * approx
        grad_w = (grad_y * z).sum(dim=(0, 1))
        grad_b = grad_y.sum(dim=(0, 1)) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None, None, None, None, None, None, None


class PowerNorm(BatchReadingNorm):
    """PowerNorm: a batch norm without mean subtraction whose forward uses a running quadratic mean and whose
    backward is approximate (Shen et al. 2020, arXiv 2003.07845, Algorithm 2), as the official ``MaskPowerNorm``
    computes it (sIncerass/powernorm, ``fairseq/modules/norms/mask_powernorm.py``).

    Training mode, iteration t (``iters``, counted by training-mode calls, 1 at the first), x group-scaled first
    (:func:`group_scale`, per token):

    - ``var = mean(x^2)`` per channel over the tokens where ``keep`` is True (the quadratic mean, psi^2);
    - ``z = x / sqrt(var + eps)`` while t <= ``warmup_iters``, then ``z = x / sqrt(running_phi + eps)``
      with ``running_phi`` from before this iteration (the paper's psi_{t-1});
    - ``running_phi``: while t < ``warmup_iters`` first the cumulative mean of the iterations' ``var``, then
      always ``running_phi <- alpha_fwd * running_phi + (1 - alpha_fwd) * var`` (the paper's psi_t^2 update);
    - ``y = weight * z + bias``.

    Backward (a custom ``torch.autograd.Function``; the group scaling is differentiated by autograd):
    ``g = weight * dL/dy``, ``approx = g - (1 - alpha_bkw) * ema_gz * z``, ``dL/dx = approx / sqrt(var + eps)``
    with the batch's var, then ``ema_gz <- ema_gz + mean(approx * z)`` over all B * L positions (the paper's
    nu_t = nu_{t-1} (1 - (1 - alpha) Gamma_t) + (1 - alpha) Lambda_t, with nu = (1 - alpha_bkw) ema_gz).

    Eval mode: ``y = weight * x / sqrt(running_phi + eps) + bias`` on the group-scaled x, buffers untouched, so
    each token's output depends on that token alone.

    Padding: the forward statistic reads real tokens only, so real tokens' outputs never depend on the pads; the
    backward's ``ema_gz`` update averages over every position, pads included, and pads get the ``- nu z`` term
    of their own, as in the official code (lines 88-93): pad content reaches later gradients through ``ema_gz``.

    ``group`` (data parallel) is not read: the official code has no collective, each process normalizes with
    its own tokens (under normlab's DDP, ``broadcast_buffers`` then copies rank 0's buffers to every rank at
    each forward).

    Args:
        dim: D, the number of channels.
        eps: added to the quadratic mean (``norm.eps``; official default 1e-5, line 103).
        bias: learn the shift ``bias`` (official: always, line 112; False drops it, as ``norm.bias=false``).
        alpha_fwd: EMA factor of ``running_phi`` (official default 0.9, line 103).
        alpha_bkw: EMA factor of the backward's ``ema_gz`` (official default 0.9, line 103).
        warmup_iters: iterations that normalize by the batch's statistic (official class default 10000, line 104;
            fairseq's ``NormSelect`` passes ``--warmup-updates``, norm_select.py line 19).
        group_num: groups of :func:`group_scale` (official class default 1, line 104; ``NormSelect`` passes the
            attention heads).

    Buffers (in the state dict): ``running_phi`` (D,) ones, ``ema_gz`` (D,) zeros, ``iters`` () long 0
    (official: ones (1, C, 1, 1), zeros (1, C, 1, 1), zeros (1,) long, lines 113-115).

    Shapes: forward x (B, L, D), keep (B, L) bool -> (B, L, D) in x's dtype; statistics in float32 (float64
    input: float64). ``keep`` needs a True entry in training mode (no real token: NaN statistics, as official).

    Raises:
        ValueError: ``dim`` not divisible by ``group_num`` (the official reshape fails there too).
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-5,
        bias: bool = True,
        alpha_fwd: float = 0.9,
        alpha_bkw: float = 0.9,
        warmup_iters: int = 10000,
        group_num: int = 1,
    ) -> None:
        super().__init__()
        if dim % group_num:
            raise ValueError(f"PowerNorm: dim={dim} is not divisible by group_num={group_num}")
        self.eps, self.alpha_fwd, self.alpha_bkw = eps, alpha_fwd, alpha_bkw
        self.warmup_iters, self.group_num = warmup_iters, group_num
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.register_buffer("running_phi", torch.ones(dim))
        self.register_buffer("ema_gz", torch.zeros(dim))
        self.register_buffer("iters", torch.zeros((), dtype=torch.long))

    def extra_repr(self) -> str:
        return (
            f"{self.weight.shape[0]}, eps={self.eps}, alpha_fwd={self.alpha_fwd}, alpha_bkw={self.alpha_bkw}, "
            f"warmup_iters={self.warmup_iters}, group_num={self.group_num}, bias={self.bias is not None}"
        )

    @torch.no_grad()
    def batch_vs_running(self, x: torch.Tensor, keep: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``phi``: the quadratic mean ``mean(x^2)`` per channel of the group-scaled x over this process's real
        tokens (the forward's ``var``, the paper's psi_B^2, with the same operations) vs ``running_phi`` (psi^2).
        No side effects; ``group`` is not read here either.

        Shapes: x (B, L, D), keep (B, L) bool -> {"phi": (batch (D,), running (D,))}, in float32 (float64 input:
        float64).
        """
        phi = group_scale(wide(x), self.group_num)[keep].pow(2).mean(dim=0)
        return {"phi": (phi, self.running_phi.to(phi.dtype))}

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        xs = group_scale(wide(x), self.group_num)  # (B, L, D)
        weight = wide(self.weight)
        bias = None if self.bias is None else wide(self.bias)
        if not self.training:
            y = weight * (xs / (self.running_phi.to(xs.dtype) + self.eps).sqrt())
            return (y if bias is None else y + bias).to(x.dtype)
        with torch.no_grad():
            self.iters.add_(1)
        y = _PowerFunction.apply(
            xs,
            weight,
            bias,
            keep,
            self.running_phi,
            self.ema_gz,
            self.iters,
            self.warmup_iters,
            self.alpha_fwd,
            self.alpha_bkw,
            self.eps,
        )
        return y.to(x.dtype)
