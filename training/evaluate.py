"""Validation loss, and decoding metrics on a held-out split: PER/WER (G2P), BLEU/chrF (translation).

Both tasks decode through one path, :func:`decode_all` (beam search; greedy is beam size 1).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from data.batching import Seq2SeqData, collate, make_batches
from data.metrics import bleu_chrf, per_wer
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, detokenize
from model.beam_search import beam_search
from model.transformer import EncoderDecoder
from training.schema import DecodeConfig


def even_stride(n: int, max_items: int | None) -> list[int]:
    """At most ``max_items`` of ``range(n)`` at an even stride (all of them for None)."""
    if max_items is None or max_items >= n:
        return list(range(n))
    return [round(i * n / max_items) for i in range(max_items)]


@dataclass
class G2PEvalSet:
    """One entry per distinct word: its letter ids and every reference pronunciation."""

    words: list[str]
    src: list[list[int]]
    refs: list[list[list[str]]]

    @classmethod
    def build(cls, words: list[str], phonemes: list[str], src_ids: list[list[int]]) -> "G2PEvalSet":
        """Group the rows of a split (one per pronunciation) by word."""
        index: dict[str, int] = {}
        out = cls([], [], [])
        for word, pron, ids in zip(words, phonemes, src_ids, strict=True):
            if word not in index:
                index[word] = len(out.words)
                out.words.append(word)
                out.src.append(ids)
                out.refs.append([])
            out.refs[index[word]].append(pron.split())
        return out

    def subset(self, max_words: int | None) -> "G2PEvalSet":
        """At most ``max_words`` words, taken at an even stride (the split is alphabetical)."""
        if max_words is None or max_words >= len(self.words):
            return self
        keep = even_stride(len(self.words), max_words)
        return G2PEvalSet([self.words[i] for i in keep], [self.src[i] for i in keep], [self.refs[i] for i in keep])


@torch.no_grad()
def evaluate_loss(model: EncoderDecoder, data: Seq2SeqData, max_tokens: int, device: torch.device) -> float:
    """Mean cross-entropy per target token (nats, no label smoothing) over ``data``."""
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device), 0
    for index in make_batches(data, max_tokens):
        batch = collate(data, index).to(device)
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
        out = beam_search(model, batch.src, bos_id=BOS_ID, eos_id=EOS_ID, beam_size=dcfg.beam_size,
                          alpha=dcfg.length_penalty, max_len=dcfg.max_len(batch.src.shape[1]))  # fmt: skip
        for row, ids in zip(index, out, strict=True):
            hyps[row] = ids
    model.train(was_training)
    return hyps


def evaluate_g2p(
    model: EncoderDecoder, eval_set: G2PEvalSet, tgt_vocab: Tokenizer, dcfg: DecodeConfig, max_tokens: int,
    device: torch.device,
) -> dict[str, float]:  # fmt: skip
    """``{"per": ..., "wer": ...}`` (fractions) of the decoded pronunciations against the closest reference."""
    hyps = decode_all(model, eval_set.src, dcfg, max_tokens, device)
    phonemes = [[tgt_vocab.id_to_token(i) for i in ids if i != PAD_ID] for ids in hyps]
    per, wer = per_wer(phonemes, eval_set.refs)
    return {"per": per, "wer": wer}


@dataclass
class TranslationEvalSet:
    """Source ids (cut to what the model's positions cover) and the raw reference sentences."""

    src: list[list[int]]
    refs: list[str]

    def subset(self, max_examples: int | None) -> "TranslationEvalSet":
        """At most ``max_examples`` sentences, taken at an even stride."""
        keep = even_stride(len(self.refs), max_examples)
        return TranslationEvalSet([self.src[i] for i in keep], [self.refs[i] for i in keep])


def evaluate_translation(
    model: EncoderDecoder, eval_set: TranslationEvalSet, tgt_vocab: Tokenizer, dcfg: DecodeConfig, max_tokens: int,
    device: torch.device,
) -> dict[str, float]:  # fmt: skip
    """``{"bleu": ..., "chrf": ...}`` (0-100, sacreBLEU) of the detokenized translations."""
    hyps = decode_all(model, eval_set.src, dcfg, max_tokens, device)
    return bleu_chrf([detokenize(tgt_vocab, ids) for ids in hyps], eval_set.refs)
