"""What every task evaluates with: validation loss, and decoding through one path, :func:`decode_all`
(beam search; greedy is beam size 1). Each task scores the decoded output itself (``training/tasks/``).
"""

from collections.abc import Sequence
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from data.batching import Seq2SeqData, collate, make_batches
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from model.batch_reading import batch_statistics, buffers_kept
from model.beam_search import beam_search
from model.transformer import EncoderDecoder
from training.schema import DecodeConfig


def even_stride(n: int, max_items: int | None) -> list[int]:
    """At most ``max_items`` of ``range(n)`` at an even stride (all of them for None)."""
    if max_items is None or max_items >= n:
        return list(range(n))
    return [round(i * n / max_items) for i in range(max_items)]


@torch.no_grad()
def evaluate_loss(
    model: EncoderDecoder, data: Seq2SeqData, max_tokens: int, device: torch.device, *, batch_stats: bool = False
) -> float:
    """Mean cross-entropy per target token (nats, no label smoothing) over ``data``, batched as training batches
    (``make_batches`` under ``max_tokens``), the model in eval mode.

    With ``batch_stats``, the batch-reading norms (BatchNorm, PowerNorm) run their training-mode forward
    (``model.batch_reading.batch_statistics``; dropout stays off, so the difference from the plain loss is the
    statistics' alone: the train/eval gap of ``val/loss_batch_stats``): BatchNorm normalizes each batch by its own
    statistics; PowerNorm does so only while that forward is within its warmup (its ``iters`` + 1 <= ``warmup_iters``)
    and after it divides by ``running_phi``, as its training forward does, so its gap is then 0.0 exactly. Their
    buffers are restored after every batch, so each batch sees the ones training left.
    """
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device), 0
    with batch_statistics(model) if batch_stats else nullcontext():
        for index in make_batches(data, max_tokens):
            batch = collate(data, index).to(device)
            with buffers_kept(model) if batch_stats else nullcontext():
                logits = model(batch.src, batch.tgt_in)  # (B, T, V)
            total += F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD_ID, reduction="sum")
            count += batch.n_tgt_tokens
    model.train(was_training)
    return total.item() / count


@torch.no_grad()
@torch.compiler.set_stance("force_eager")  # compiled layers run eagerly here: decoding shapes change every step
def decode_all(
    model: EncoderDecoder, src: Sequence[list[int]], dcfg: DecodeConfig, max_tokens: int, device: torch.device
) -> list[list[int]]:
    """The best hypothesis (ids without BOS/EOS) for every source (ids without EOS), in order.

    Sources are batched by length under ``max_tokens`` (as in training), each batch decoded by
    :func:`model.beam_search.beam_search` with the incremental decoder cache.
    """
    was_training = model.training
    model.eval()
    data = Seq2SeqData(list(src), [[] for _ in src])
    hyps: list[list[int]] = [[] for _ in src]
    for index in make_batches(data, max_tokens):
        batch = collate(data, index).to(device)
        out = beam_search(
            model,
            batch.src,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            beam_size=dcfg.beam_size,
            alpha=dcfg.length_penalty,
            max_len=dcfg.max_len(batch.src.shape[1]),
        )
        for row, ids in zip(index, out, strict=True):
            hyps[row] = ids
    model.train(was_training)
    return hyps
