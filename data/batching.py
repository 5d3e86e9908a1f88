"""Length-bucketed batches under a token budget, and padding into tensors.

Examples are sorted by length (ties broken by a seeded shuffle, so batch contents change
between epochs) and cut into batches whose padded size, rows x longest sequence, stays under
``max_tokens``; the order of the batches is then shuffled. Everything is a function of
(seed, epoch), so a resumed run sees exactly the batches it would have seen.

Shape legend: B rows in a batch, S longest src (+EOS), T longest tgt (+BOS/EOS).
"""

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from data.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Seq2SeqData:
    """Token ids of one split, without special tokens; ``src[i]`` pairs with ``tgt[i]``."""

    src: list[list[int]]
    tgt: list[list[int]]

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise ValueError(f"src has {len(self.src)} rows but tgt has {len(self.tgt)}")

    def __len__(self) -> int:
        return len(self.src)

    def padded_len(self, i: int) -> int:
        """Tokens row ``i`` occupies in a batch: its longer side plus one special token."""
        return max(len(self.src[i]), len(self.tgt[i])) + 1


@dataclass
class Batch:
    """A padded batch. src (B, S), tgt_in (B, T) starting with BOS, tgt_out (B, T) ending with
    EOS; ``index`` holds the dataset rows; ``n_tgt_tokens`` counts non-pad target tokens."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    index: list[int]
    n_tgt_tokens: int

    @property
    def src_pad_mask(self) -> torch.Tensor:
        """(B, S) bool, True at src padding."""
        return self.src.eq(PAD_ID)

    @property
    def tgt_pad_mask(self) -> torch.Tensor:
        """(B, T) bool, True at tgt padding (the same positions in tgt_in and tgt_out)."""
        return self.tgt_out.eq(PAD_ID)

    def to(self, device: torch.device) -> "Batch":
        src, tgt_in, tgt_out = (t.to(device, non_blocking=True) for t in (self.src, self.tgt_in, self.tgt_out))
        return Batch(src, tgt_in, tgt_out, self.index, self.n_tgt_tokens)


def check_budget(data: Seq2SeqData, max_tokens: int) -> None:
    """Raise ``ValueError`` naming the minimum budget if a row of ``data`` cannot fit ``max_tokens``."""
    if len(data) == 0:
        raise ValueError("cannot batch an empty split")
    longest = max(data.padded_len(i) for i in range(len(data)))
    if longest > max_tokens:
        raise ValueError(
            f"trainer.max_tokens={max_tokens} is smaller than the longest row ({longest} tokens); "
            f"use trainer.max_tokens >= {longest}"
        )


def make_batches(data: Seq2SeqData, max_tokens: int, generator: torch.Generator | None = None) -> list[list[int]]:
    """Group row indices into length-bucketed batches of at most ``max_tokens`` padded tokens.

    With a generator, ties in length are broken at random and the batch order is shuffled;
    without one, the order is by length (deterministic, for evaluation).

    Raises:
        ValueError: empty data, or ``max_tokens`` below the longest row (the message names the minimum).
    """
    check_budget(data, max_tokens)
    order = torch.randperm(len(data), generator=generator).tolist() if generator is not None else range(len(data))
    order = sorted(order, key=data.padded_len)  # stable: the shuffle breaks ties
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = data.padded_len(i)  # sorted ascending, so the newest row is the longest
        if (len(current) + 1) * longest > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    batches.append(current)
    if generator is not None:
        batches = [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def batch_shape(data: Seq2SeqData, index: list[int]) -> tuple[int, int, int, int]:
    """(B, S, T, target tokens) of the batch :func:`collate` would make from rows ``index``."""
    S = max(len(data.src[i]) for i in index) + 1
    T = max(len(data.tgt[i]) for i in index) + 1
    return len(index), S, T, sum(len(data.tgt[i]) + 1 for i in index)


def collate(data: Seq2SeqData, index: list[int]) -> Batch:
    """Pad rows ``index`` into a :class:`Batch`: src + EOS, BOS + tgt, tgt + EOS."""
    B, S, T, n_tgt = batch_shape(data, index)
    # One tensor per field from padded lists: filling row by row costs ~3 small tensors per row.
    src = torch.tensor([data.src[i] + [EOS_ID] + [PAD_ID] * (S - 1 - len(data.src[i])) for i in index])
    tgt_in = torch.tensor([[BOS_ID] + data.tgt[i] + [PAD_ID] * (T - 1 - len(data.tgt[i])) for i in index])
    tgt_out = torch.tensor([data.tgt[i] + [EOS_ID] + [PAD_ID] * (T - 1 - len(data.tgt[i])) for i in index])
    return Batch(src, tgt_in, tgt_out, list(index), n_tgt)


@dataclass
class StepBatches:
    """What one optimizer step trains on, seen from one rank.

    Attributes:
        epoch: epoch of these batches.
        next_batch: index (in the epoch's batch order) of the first batch of the next step:
            where a run resumed after this step continues.
        micro: this rank's micro-batches (``trainer.grad_accum`` of them).
        shapes: (B, S, T, target tokens) of every batch of the step, all ranks.
    """

    epoch: int
    next_batch: int
    micro: list[Batch]
    shapes: list[tuple[int, int, int, int]]

    @property
    def n_tgt_tokens(self) -> int:
        """Target tokens of the whole step, all ranks: the loss is averaged over these."""
        return sum(shape[3] for shape in self.shapes)


def train_stream(
    data: Seq2SeqData,
    max_tokens: int,
    seed: int,
    start_epoch: int = 0,
    start_batch: int = 0,
    *,
    rank: int = 0,
    world: int = 1,
    accum: int = 1,
) -> Iterator[StepBatches]:
    """Endless optimizer steps, reshuffled each epoch from ``(seed, epoch)``; starts at
    ``(start_epoch, start_batch)`` so a resumed run continues exactly.

    A step takes the next ``world x accum`` batches of the epoch's order: rank r trains on
    batches ``r*accum ... r*accum + accum - 1`` of them, so every rank sees other data and the
    union is what one process with ``accum x world`` accumulation steps would see. The last
    ``len % (world x accum)`` batches of an epoch are skipped (the next epoch reshuffles).

    Raises:
        ValueError: the split has fewer batches than ``world x accum``.
    """
    per_step = world * accum
    epoch = start_epoch
    while True:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        batches = make_batches(data, max_tokens, gen)
        usable = len(batches) - len(batches) % per_step
        if usable == 0:
            raise ValueError(
                f"the training split makes {len(batches)} batches, fewer than world size x "
                f"trainer.grad_accum = {per_step}; lower trainer.grad_accum or trainer.max_tokens"
            )
        for b in range(start_batch if epoch == start_epoch else 0, usable, per_step):
            group = batches[b : b + per_step]
            mine = group[rank * accum : (rank + 1) * accum]
            yield StepBatches(epoch, b + per_step, [collate(data, i) for i in mine], [batch_shape(data, i) for i in group])
        epoch += 1
