"""BatchNorm over the real tokens of a stream (``norm.kind=batchnorm``): written from the formula
(:class:`BatchNorm`, ``custom``) and ``torch.nn.BatchNorm1d`` on the gathered tokens (:class:`NativeBatchNorm`,
``native``).

Batch normalization (Ioffe & Szegedy 2015, arXiv 1502.03167, Algorithm 1) over a stream x (B, L, D) with
its keep mask (B, L): the N real tokens x[keep] (N, D) are the mini-batch, each of the D channels is
normalized by its mean and biased variance over them, ``y = (x - mean) / sqrt(var + eps) * weight + bias``.
Pad positions are not normalized: their output is 0 in both impls (attention masks pad keys and the loss
ignores pad targets, so nothing reads it). The constants are ``nn.BatchNorm1d``'s (torch docs,
``torch.nn.BatchNorm1d``): running statistics ``running = (1 - momentum) * running + momentum * batch`` with
momentum 0.1, the running variance from the unbiased batch variance (times N / (N - 1)), and a
``num_batches_tracked`` counter; eps is ``norm.eps``, passed explicitly. Both impls have the parameters
``weight`` (init 1) and ``bias`` (init 0; none with ``norm.bias=false``) and the buffers ``running_mean``
(init 0), ``running_var`` (init 1) and ``num_batches_tracked`` (init 0), named as ``nn.BatchNorm1d``'s, so a
state dict moves between them.
"""

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn

from model.batch_reading import BatchReadingNorm, wide

MOMENTUM = 0.1  # nn.BatchNorm1d's default momentum: the weight of the batch's statistics in the running ones


def _check_count(n: int) -> None:
    """Raise ``ValueError`` when training-mode statistics would read fewer than 2 real tokens."""
    if n < 2:
        raise ValueError(
            f"norm.kind=batchnorm needs at least 2 real tokens in a training batch for its variance "
            f"(the running variance is unbiased, N / (N - 1)); got {n}"
        )


@torch.no_grad()
def _compared(
    norm: "BatchNorm | NativeBatchNorm", x: torch.Tensor, keep: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``batch_vs_running`` of either impl: the mean and the biased variance of this process's real tokens,
    with the custom forward's operations (its values bit for bit on one process), beside the running buffers."""
    xr = wide(x[keep])  # (N, D)
    mean = xr.sum(0) / xr.shape[0]
    var = (xr - mean).pow(2).sum(0) / xr.shape[0]
    return {"mean": (mean, norm.running_mean.to(mean.dtype)), "var": (var, norm.running_var.to(var.dtype))}


def _summed(t: torch.Tensor, group: torch.distributed.ProcessGroup) -> torch.Tensor:
    """t summed over the ranks of ``group``, differentiable: the gradient of each rank's t is the sum of the
    output gradients of every rank. torch's functional collective (``torch.distributed.nn.functional``'s
    ``all_reduce``, the same rule, is deprecated in torch 2.13 with a FutureWarning naming this one); waited
    on here, so the caller gets a plain tensor."""
    return funcol.wait_tensor(funcol.all_reduce(t, "sum", group))


def _scatter(x: torch.Tensor, keep: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, L, D) zeros in x's dtype with the rows y (N, D) at the N positions where ``keep`` is True."""
    return x.new_zeros(x.shape).index_put((keep,), y.to(x.dtype))


class BatchNorm(BatchReadingNorm):
    """BatchNorm written from the formula (Ioffe & Szegedy 2015, arXiv 1502.03167, Algorithm 1), over the real
    tokens of a stream and, when ``group`` is set, of every rank of the data-parallel group.

    Training mode: mean and biased variance (divided by N) per channel over the N real tokens of every rank
    of ``group`` (token-weighted: a rank with more real tokens counts for more, as if the ranks' batches were
    one), through ``torch.distributed._functional_collectives.all_reduce`` (sum; its backward sums the output
    gradients over the group, the autograd rule torch 2.13 registers), so gradients flow to every rank's tokens;
    ``y = (x - mean) / sqrt(var + eps) * weight + bias``; the running buffers are updated as
    ``nn.BatchNorm1d`` updates them (module docstring). Eval mode: the running mean and variance instead.
    Computed in float32 (float64 inputs: float64), cast back to x's dtype.

    Args:
        dim: D, the number of channels.
        eps: added to the variance inside the square root.
        bias: learn the shift ``bias`` (False: none, as ``nn.BatchNorm1d(bias=False)``).

    Shapes: x (B, L, D), keep (B, L) bool -> (B, L, D) in x's dtype, 0 at the pad positions.

    Raises:
        ValueError: training mode with fewer than 2 real tokens in all (over the group's ranks).
    """

    def __init__(self, dim: int, eps: float, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        xr = wide(x[keep])  # (N, D): this rank's real tokens
        if self.training:
            xc, var = self._train_statistics(xr)
        else:
            xc, var = xr - wide(self.running_mean), wide(self.running_var)
        y = xc * torch.rsqrt(var + self.eps) * wide(self.weight)
        return _scatter(x, keep, y if self.bias is None else y + wide(self.bias))

    def _train_statistics(self, xr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(xr centred on the batch mean (N, D), biased variance (D,)) over the real tokens xr (N, D) of every
        rank; updates the running buffers. Two passes (the sum, then the squares about the mean), each summed
        over the group, as one process would compute them on the ranks' tokens together."""
        n, sums = xr.shape[0], xr.sum(0)  # N, (D,): this rank's count (on the host: no sync) and channel sums
        if self.group is not None:  # one collective for the sums and the count, which the check reads on the host
            total = _summed(torch.cat([sums, xr.new_tensor([n])]), self.group)
            sums, n = total[:-1], int(total[-1].item())
        _check_count(n)  # the same total on every rank: all raise together, none waits in a collective
        mean = sums / n
        xc = xr - mean  # (N, D), the output's too: one subtraction (and one backward through it), not two
        squares = xc.pow(2).sum(0)
        if self.group is not None:
            squares = _summed(squares, self.group)
        var = squares / n
        with torch.no_grad():  # the update nn.BatchNorm1d makes (ATen's batch_norm_cpu_update_stats_template)
            unbiased = var * (n / (n - 1))
            self.running_mean.copy_(MOMENTUM * mean + (1 - MOMENTUM) * self.running_mean)
            self.running_var.copy_(MOMENTUM * unbiased + (1 - MOMENTUM) * self.running_var)
            self.num_batches_tracked.add_(1)
        return xc, var

    def batch_vs_running(self, x: torch.Tensor, keep: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``mean``: the per-channel mean of this process's real tokens vs ``running_mean``; ``var``: their biased
        variance (divided by N) vs ``running_var``. Biased because that is the variance a training-mode forward
        divides by (Algorithm 1's sigma_B^2, the batch statistic Shen et al. 2020, arXiv 2003.07845, Fig. 2,
        compare with the running one); ``running_var`` blends the unbiased N / (N - 1) estimate, so even
        without fluctuation the batch value sits below it by sigma^2 / N in expectation (docs/telemetry.md's
        Gaussian baseline counts it). Under data parallel this rank's tokens only, with no collective (the
        forward sums over the group's). No side effects.

        Shapes: x (B, L, D), keep (B, L) bool -> {"mean", "var"}: (batch (D,), running (D,)), in float32
        (float64 input: float64).
        """
        return _compared(self, x, keep)


class NativeBatchNorm(nn.BatchNorm1d, BatchReadingNorm):
    """``torch.nn.BatchNorm1d(D, eps=eps, momentum=0.1)`` applied to a stream's real tokens x[keep] (N, D), the
    outputs scattered back, 0 at the pad positions: what :class:`BatchNorm` computes, by torch.

    This process's tokens only: setting ``group`` (``EncoderDecoder.set_norm_group``, done under torchrun)
    raises, since ``nn.SyncBatchNorm``, torch's cross-process BatchNorm, runs on GPU input only (torch 2.13
    raises ``ValueError`` for CPU input in training mode).

    Args:
        dim: D, the number of channels.
        eps: added to the variance inside the square root.
        bias: learn the shift ``bias`` (False: ``nn.BatchNorm1d(bias=False)``).

    Shapes: x (B, L, D), keep (B, L) bool -> (B, L, D) in x's dtype, 0 at the pad positions.

    Raises:
        ValueError: training mode with fewer than 2 real tokens (forward); a process group set (``group``).
    """

    def __init__(self, dim: int, eps: float, bias: bool = True) -> None:
        super().__init__(dim, eps=eps, momentum=MOMENTUM, bias=bias)

    @property
    def group(self) -> None:
        """Always None: this impl reads this process's tokens only (setting a group raises ``ValueError``)."""
        return None

    @group.setter
    def group(self, group: torch.distributed.ProcessGroup | None) -> None:
        if group is not None:
            raise ValueError(
                "norm.kind=batchnorm with norm.impl=native takes its statistics over this process's "
                "tokens only (nn.SyncBatchNorm needs GPU input); under torchrun use norm.impl=custom"
            )

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        xr = x[keep]  # (N, D)
        if self.training:
            _check_count(xr.shape[0])
        return _scatter(x, keep, super().forward(xr))

    def batch_vs_running(self, x: torch.Tensor, keep: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`BatchNorm.batch_vs_running`: computed by normlab in float32 rather than by torch's kernel, which
        normalizes with the same biased variance to float32 rounding."""
        return _compared(self, x, keep)
