"""The training progress bar (tqdm): the step and the learning rate of every step, and the loss and throughput of the
last logging step, labelled with that step. They are measured there only (reading the loss every step would
synchronize a GPU every step), so without the label a bar between logging steps shows stale numbers as current."""

from types import TracebackType

from tqdm import tqdm


class Progress:
    """``tqdm`` over a run's steps, from ``initial`` (a resumed run's step) to ``total``; ``disable`` on ranks other than 0."""

    def __init__(self, total: int, initial: int, disable: bool) -> None:
        self.bar = tqdm(total=total, initial=initial, desc="train", disable=disable)
        self.shown: dict[str, str] = {}  # lr, then loss and tok_s once a step has logged them

    def step(self, lr: float) -> None:
        """One step done, at learning rate ``lr``."""
        self.shown["lr"] = f"{lr:.2e}"
        self.bar.set_postfix(self.shown, refresh=False)
        self.bar.update(1)

    def logged(self, step: int, metrics: dict[str, float]) -> None:
        """Show the loss and tokens/s that logging step ``step`` measured (``train/loss``, ``perf/tokens_per_s``)."""
        self.shown |= {"loss": f"{metrics['train/loss']:.3f} (step {step})", "tok_s": f"{metrics['perf/tokens_per_s']:.0f}"}
        self.bar.set_postfix(self.shown)

    def write(self, line: str) -> None:
        """Print ``line`` above the bar."""
        self.bar.write(line)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.bar.close()
