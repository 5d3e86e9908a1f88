"""The logging window: what train.py's loop accumulates between two logging steps, and the one
host sync per logging step that turns it into the metrics row."""

import resource
import time

import torch
from tqdm import tqdm

from telemetry.core import first_nonfinite
from training import distributed
from training.interrupt import NonFiniteLossError
from training.run import Run
from training.step import StepResult


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process in GiB: CUDA max allocated, or on CPU the peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # Linux reports KiB


class LogWindow:
    """Loss and z-loss (summed on the device: no host sync per step), each step's loss and gradient
    norm (kept on the device, for the run's spike scores: ``training.spikes``), target tokens, model
    FLOPs and wall time of the steps since the last logging step; the first step whose loss was
    non-finite; and, across windows, the latest telemetry record (drawn as a depth profile at
    evaluations) and the first telemetry metric that went non-finite (named when the loss does).

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
        self.step_losses: list[torch.Tensor] = []
        self.step_grad_norms: list[torch.Tensor] = []
        self.steps, self.tokens, self.flops = 0, 0, 0.0
        self.t0 = time.perf_counter()

    def add(self, step: int, result: StepResult, tokens: int, flops: float) -> None:
        """Count one optimizer step: its loss, gradient norm and z-loss (0-dim device tensors), target
        tokens and FLOPs."""
        loss = result.loss
        self.first_bad_step = torch.where((self.first_bad_step < 0) & ~torch.isfinite(loss), step, self.first_bad_step)
        self.loss_sum += loss
        self.z_loss_sum += result.z_loss
        self.step_losses.append(loss)
        self.step_grad_norms.append(result.grad_norm)
        self.steps += 1
        self.tokens += tokens
        self.flops += flops

    def close(self, run: Run, lr: float, signum: int) -> tuple[dict[str, float], int]:
        """The metrics row of this window at ``run.step`` and the stop signal the ranks agree on (0: none);
        feeds every step's loss and gradient norm of the window to ``run.spikes``.

        The loop's only host sync besides telemetry: the losses, non-finite flag and signal are
        reduced over ranks, so every rank must call this on the same steps.

        Raises:
            NonFiniteLossError: a step of the run had a non-finite loss (on any rank).
        """
        stats = run.telemetry.collect()
        clipped = torch.nn.utils.get_total_norm([p.grad for p in run.model.parameters() if p.grad is not None])
        bad = distributed.all_reduce(self.first_bad_step.clone(), "max")
        signal = distributed.all_reduce(torch.tensor(signum, device=run.device), "max")
        # One all-reduce for the window's sums and each step's loss (a rank's share; the grad norm is global).
        losses = distributed.all_reduce(torch.stack([self.loss_sum, self.z_loss_sum, *self.step_losses])) / run.world
        grad_norms = torch.stack(self.step_grad_norms)
        row = torch.cat([torch.stack([bad.float(), signal.float(), clipped, grad_norms[-1]]), losses, grad_norms])
        bad, signum, norm_clipped, norm, loss, z_loss, *per_step = row.tolist()  # the one transfer
        if self.first_bad_site is None:
            self.first_bad_site = first_nonfinite(stats)
            if self.first_bad_site:
                tqdm.write(f"step {run.step}: first non-finite telemetry value at {self.first_bad_site}")
        if bad >= 0:
            where = f"; first non-finite activation: {self.first_bad_site}" if self.first_bad_site else ""
            raise NonFiniteLossError(
                f"non-finite training loss at step {int(bad)}{where}; last finite checkpoint: {run.last_good}", int(bad)
            )
        run.spikes.add(per_step[: self.steps], per_step[self.steps :])
        if stats:
            self.record, self.record_step = stats, run.step
        elapsed = time.perf_counter() - self.t0
        run.counters["wall_s"] += elapsed
        run.counters["tgt_tokens"] += self.tokens
        mfu = {"perf/mfu": self.flops / elapsed / (run.peak_flops * run.world)} if run.peak_flops else {}
        train = {"train/loss": loss / self.steps, **({"train/z_loss": z_loss / self.steps} if self.z_loss else {})}
        return {
            **train,
            **run.spikes.metrics(),
            "optim/lr": lr,
            "optim/grad_norm": norm,
            "optim/grad_norm_clipped": norm_clipped,
            "perf/tokens_per_s": self.tokens / elapsed,
            "perf/step_ms": 1000 * elapsed / self.steps,
            **mfu,
            "mem/peak_gib": peak_memory_gib(run.device),
            **stats,
        }, int(signum)
