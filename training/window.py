"""The logging window: what train.py's loop accumulates between two logging steps, and the one
host sync per logging step that turns it into the metrics row."""

import resource
import time

import torch
from tqdm import tqdm

from model.telemetry import first_nonfinite
from training import distributed
from training.run import Run


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or inf; the message names the step and the last good checkpoint."""


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process in GiB: CUDA max allocated, or on CPU the peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # Linux reports KiB


class LogWindow:
    """Loss and z-loss (summed on the device: no host sync per step), target tokens, model FLOPs and
    wall time of the steps since the last logging step; the first step whose loss was non-finite;
    and, across windows, the latest telemetry record (drawn as a depth profile at evaluations) and
    the first telemetry metric that went non-finite (named when the loss does).

    Args:
        device: where the sums live.
        z_loss: whether the run trains with a z-loss (``optim.z_loss`` > 0): ``train/z_loss`` is logged.
    """

    def __init__(self, device: torch.device, z_loss: bool = False) -> None:
        self.z_loss = z_loss
        self.loss_sum = torch.zeros((), device=device)
        self.z_loss_sum = torch.zeros((), device=device)
        self.first_bad_step = torch.full((), -1, device=device)  # -1: every loss so far was finite
        self.first_bad_site: str | None = None
        self.record: dict[str, float] = {}
        self.record_step = 0
        self.restart()

    def restart(self) -> None:
        """Open a new window (after logging, evaluating and checkpointing: their time is not throughput)."""
        self.loss_sum.zero_()
        self.z_loss_sum.zero_()
        self.steps, self.tokens, self.flops = 0, 0, 0.0
        self.t0 = time.perf_counter()

    def add(self, step: int, loss: torch.Tensor, z_loss: torch.Tensor, tokens: int, flops: float) -> None:
        """Count one optimizer step: its loss and z-loss (0-dim device tensors, ``StepResult``), target
        tokens and FLOPs."""
        self.first_bad_step = torch.where((self.first_bad_step < 0) & ~torch.isfinite(loss), step, self.first_bad_step)
        self.loss_sum += loss
        self.z_loss_sum += z_loss
        self.steps += 1
        self.tokens += tokens
        self.flops += flops

    def close(self, run: Run, lr: float, grad_norm: torch.Tensor, signum: int) -> tuple[dict[str, float], int]:
        """The metrics row of this window at ``run.step`` and the stop signal the ranks agree on (0: none).

        The loop's only host sync besides telemetry: the loss, non-finite flag and signal are
        reduced over ranks, so every rank must call this on the same steps.

        Raises:
            NonFiniteLossError: a step of the run had a non-finite loss (on any rank).
        """
        stats = run.telemetry.collect()
        clipped = torch.nn.utils.get_total_norm([p.grad for p in run.model.parameters() if p.grad is not None])
        bad = distributed.all_reduce(self.first_bad_step.clone(), "max")
        signal = distributed.all_reduce(torch.tensor(signum, device=run.device), "max")
        loss, z_loss = distributed.all_reduce(torch.stack([self.loss_sum, self.z_loss_sum])) / run.world
        row = [bad.float(), loss, z_loss, grad_norm, clipped, signal.float()]
        bad, loss, z_loss, norm, norm_clipped, signum = torch.stack(row).tolist()
        if self.first_bad_site is None:
            self.first_bad_site = first_nonfinite(stats)
            if self.first_bad_site:
                tqdm.write(f"step {run.step}: first non-finite telemetry value at {self.first_bad_site}")
        if bad >= 0:
            where = f"; first non-finite activation: {self.first_bad_site}" if self.first_bad_site else ""
            raise NonFiniteLossError(f"non-finite training loss at step {int(bad)}{where}; "
                                     f"last finite checkpoint: {run.last_good}")  # fmt: skip
        if stats:
            self.record, self.record_step = stats, run.step
        elapsed = time.perf_counter() - self.t0
        run.counters["wall_s"] += elapsed
        run.counters["tgt_tokens"] += self.tokens
        mfu = {"perf/mfu": self.flops / elapsed / (run.peak_flops * run.world)} if run.peak_flops else {}
        losses = {"train/loss": loss / self.steps, **({"train/z_loss": z_loss / self.steps} if self.z_loss else {})}
        return {
            **losses, "optim/lr": lr, "optim/grad_norm": norm, "optim/grad_norm_clipped": norm_clipped,
            "perf/tokens_per_s": self.tokens / elapsed, "perf/step_ms": 1000 * elapsed / self.steps, **mfu,
            "mem/peak_gib": peak_memory_gib(run.device), **stats,
        }, int(signum)  # fmt: skip
