"""Validation loss and G2P decoding metrics (PER/WER) on a held-out split."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from data.batching import Seq2SeqData, collate, make_batches
from data.metrics import per_wer
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from model.transformer import EncoderDecoder


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
        keep = [round(i * len(self.words) / max_words) for i in range(max_words)]
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
def greedy_phonemes(
    model: EncoderDecoder, eval_set: G2PEvalSet, tgt_vocab: Tokenizer, max_tokens: int, device: torch.device
) -> list[list[str]]:
    """Greedy pronunciation of every word of ``eval_set``, as phoneme lists, in its order."""
    was_training = model.training
    model.eval()
    data = Seq2SeqData(eval_set.src, [[] for _ in eval_set.src])
    hyps: list[list[str]] = [[] for _ in eval_set.src]
    for index in make_batches(data, max_tokens):
        batch = collate(data, index).to(device)
        out = model.greedy_decode(batch.src, BOS_ID, EOS_ID, max_len=batch.src.shape[1] + 8).tolist()
        for row, ids in zip(index, out, strict=True):
            ids = ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids
            hyps[row] = [tgt_vocab.id_to_token(i) for i in ids if i != PAD_ID]
    model.train(was_training)
    return hyps


def evaluate_g2p(
    model: EncoderDecoder, eval_set: G2PEvalSet, tgt_vocab: Tokenizer, max_tokens: int, device: torch.device
) -> dict[str, float]:
    """``{"per": ..., "wer": ...}`` (fractions) of greedy decoding against the closest reference."""
    per, wer = per_wer(greedy_phonemes(model, eval_set, tgt_vocab, max_tokens, device), eval_set.refs)
    return {"per": per, "wer": wer}
