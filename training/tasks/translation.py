"""Sentence translation with byte-level BPE; sacreBLEU BLEU and chrF (0-100) of the detokenized output."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from data.batching import Seq2SeqData
from data.bpe import cached_bpe
from data.metrics import bleu_chrf
from data.tokenizer import detokenize, encode_all
from data.translation import load_pairs
from model.transformer import EncoderDecoder
from training.evaluate import decode_all, even_stride
from training.schema import DecodeConfig, RunConfig
from training.tasks import Task, restored_vocabularies


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
    model: EncoderDecoder,
    eval_set: TranslationEvalSet,
    tgt_vocab: Tokenizer,
    dcfg: DecodeConfig,
    max_tokens: int,
    device: torch.device,
) -> dict[str, float]:
    """``{"bleu": ..., "chrf": ...}`` (0-100, sacreBLEU) of the detokenized translations."""
    hyps = decode_all(model, eval_set.src, dcfg, max_tokens, device)
    return bleu_chrf([detokenize(tgt_vocab, ids) for ids in hyps], eval_set.refs)


class TranslationTask(Task):
    """Sentence translation with byte-level BPE; sacreBLEU BLEU and chrF (0-100) on detokenized text.

    Training pairs with a side over ``data.max_len`` BPE tokens are dropped (null: the longest the
    model's positions cover); ``valid`` keeps the pairs within it for the loss. BLEU and chrF are
    always on every sentence of valid/test: a source beyond the model's positions is cut to fit.
    """

    name = "translation"
    examples = "sentences"

    def __init__(self, cfg: RunConfig, run_dir: Path | None, resume: dict[str, Any] | None) -> None:
        super().__init__(cfg, run_dir)
        dcfg = cfg.data
        longest = cfg.model.max_len - 1  # one position is BOS/EOS
        max_len = longest if dcfg.max_len is None else dcfg.max_len
        if max_len > longest:
            raise ValueError(f"data.max_len={max_len} is invalid; it must be <= model.max_len - 1 = {longest}")
        pairs = load_pairs(dcfg)
        restored = restored_vocabularies(self.name, resume)
        if restored:
            self.src_vocab, self.tgt_vocab = restored
            where = "from the checkpoint"
        else:
            self.src_vocab, self.tgt_vocab, path = cached_bpe(
                pairs["train"].src,
                pairs["train"].tgt,
                vocab_size=dcfg.vocab_size,
                joint=dcfg.joint_vocab,
                cache_dir=dcfg.cache_dir,
            )
            where = f"cached in {path.parent}"
        self.share_embeddings = self.src_vocab.to_str() == self.tgt_vocab.to_str()
        self._save_vocabularies()
        encoded = {s: Seq2SeqData(encode_all(self.src_vocab, p.src), encode_all(self.tgt_vocab, p.tgt)) for s, p in pairs.items()}
        self.data = {s: _within(encoded[s], max_len) for s in ("train", "valid")}
        if not len(self.data["train"]):
            raise ValueError(f"data.max_len={max_len}: every training pair has a side longer than that; raise it")
        self.eval_sets = {
            s: TranslationEvalSet([ids[:longest] for ids in encoded[s].src], pairs[s].tgt) for s in ("valid", "test")
        }
        kind = "joint" if self.share_embeddings else "separate"
        print(
            f"normlab: {dcfg.name} {dcfg.src_lang}->{dcfg.tgt_lang}: {len(self.data['train'])} training pairs "
            f"({len(encoded['train']) - len(self.data['train'])} over {max_len} tokens dropped), "
            f"{len(pairs['valid'].src)} valid, {len(pairs['test'].src)} test; {kind} BPE vocabulary of "
            f"{self.tgt_vocab.get_vocab_size()} tokens {where}"
        )

    def evaluate(self, model: EncoderDecoder, split: str, max_examples: int | None, device: torch.device) -> dict[str, float]:
        """``{"bleu", "chrf"}`` on at most ``max_examples`` sentences of ``split`` (valid or test)."""
        return evaluate_translation(
            model, self.eval_sets[split].subset(max_examples), self.tgt_vocab, self.decode, self.max_tokens, device
        )


def _within(data: Seq2SeqData, max_len: int) -> Seq2SeqData:
    """The pairs of ``data`` whose sides both have at most ``max_len`` tokens."""
    keep = [i for i in range(len(data)) if len(data.src[i]) <= max_len and len(data.tgt[i]) <= max_len]
    return Seq2SeqData([data.src[i] for i in keep], [data.tgt[i] for i in keep])


TASK = TranslationTask
