"""Incremental decoder cache and beam search: the cache changes no logit, beam 1 is greedy."""

import pytest
import torch

from model.beam_search import beam_search, length_penalty
from model.config import ModelConfig, NormConfig
from model.transformer import DecoderCache, EncoderDecoder

BOS, EOS, PAD = 1, 2, 0


def make_model(placement: str = "pre", positions: str = "sinusoidal", seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(src_vocab=20, tgt_vocab=24, d_model=32, n_heads=4, d_ff=64, n_enc_layers=2, n_dec_layers=3,
                      dropout=0.0, max_len=40, positions=positions, norm=NormConfig(placement=placement))  # fmt: skip
    return EncoderDecoder(cfg).eval()


def padded_src(seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    src = torch.randint(4, 20, (5, 9))
    src[1, 6:] = PAD
    src[3, 2:] = PAD
    return src


@torch.no_grad()
def reference_greedy(model: EncoderDecoder, src: torch.Tensor, max_len: int) -> list[list[int]]:
    """normlab's former ``greedy_decode``: the whole prefix recomputed at every step."""
    max_len = min(max_len, model.cfg.max_len - 1)
    src_pad_mask = src.eq(PAD)
    memory = model.encode(src, src_pad_mask)
    ys = torch.full((src.shape[0], 1), BOS, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        next_tok = model.decode(ys, memory, src_pad_mask)[:, -1].argmax(-1).masked_fill(done, PAD)
        ys = torch.cat([ys, next_tok[:, None]], dim=1)
        done |= next_tok.eq(EOS)
        if bool(done.all()):
            break
    out = []
    for ids in ys[:, 1:].tolist():
        out.append(ids[: ids.index(EOS)] if EOS in ids else ids)
    return out


@pytest.mark.parametrize(("placement", "positions"), [("pre", "sinusoidal"), ("post", "learned"), ("sandwich", "sinusoidal"),
                                                      ("deepnorm", "sinusoidal"), ("lns", "sinusoidal")])  # fmt: skip
def test_cached_decoder_logits_equal_full_recomputation(placement, positions):
    model = make_model(placement, positions)
    src = padded_src()
    tgt = torch.randint(3, 24, (5, 12))
    tgt[:, 0] = BOS
    src_pad_mask = src.eq(PAD)
    memory = model.encode(src, src_pad_mask)
    full = model.decode(tgt, memory, src_pad_mask)  # (B, T, V)
    cache = DecoderCache(len(model.decoder))
    # One token at a time, then a block of three after a cached prefix (the shifted causal mask).
    steps = [model.decode(tgt[:, t : t + 1], memory, src_pad_mask, cache) for t in range(9)]
    steps.append(model.decode(tgt[:, 9:12], memory, src_pad_mask, cache))
    assert len(cache) == 12
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_one_equals_greedy_by_full_recomputation(seed):
    model = make_model(seed=seed)
    src = padded_src(seed)
    expected = reference_greedy(model, src, max_len=15)
    assert beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=1, alpha=0.6, max_len=15) == expected


def test_beam_one_equals_greedy_when_sentences_stop_at_different_steps():
    model = make_model()
    output = torch.nn.Linear(32, 24)  # an output layer with a bias toward EOS, so rows stop early
    with torch.no_grad():
        output.weight.copy_(model.output.weight)
        output.bias.zero_()
        output.bias[EOS] = 3.8
    model.output = output
    src = padded_src(5)
    expected = reference_greedy(model, src, max_len=30)
    assert len({len(h) for h in expected}) > 2 and min(len(h) for h in expected) < 29  # stops at different steps
    assert beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=1, alpha=0.0, max_len=30) == expected


@torch.no_grad()
def exhaustive_best(model: EncoderDecoder, src: torch.Tensor, max_len: int, alpha: float) -> list[int]:
    """The best-scoring hypothesis of one sentence over every sequence up to max_len tokens."""
    V = model.cfg.tgt_vocab
    src_pad_mask = src.eq(PAD)
    memory = model.encode(src, src_pad_mask)
    best, frontier = (float("-inf"), []), [([], 0.0)]
    for step in range(max_len):
        prefixes = torch.tensor([[BOS] + p for p, _ in frontier])
        logp = model.decode(prefixes, memory.expand(len(frontier), -1, -1), src_pad_mask.expand(len(frontier), -1))
        logp = logp[:, -1].log_softmax(-1)
        nxt = []
        for (p, s), row in zip(frontier, logp, strict=True):
            for tok in range(V):
                score = s + float(row[tok])
                if tok == EOS or step == max_len - 1:
                    hyp = p if tok == EOS else p + [tok]
                    best = max(best, (score / length_penalty(step + 1, alpha), hyp))
                else:
                    nxt.append((p + [tok], score))
        frontier = nxt
    return best[1]


def test_wide_beam_finds_the_exhaustive_best():
    model = make_model(seed=3)
    src = padded_src(3)[:1, :4]
    V = model.cfg.tgt_vocab
    # A beam as wide as the search space (V^2 sequences of 2 tokens) is exact.
    got = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=V * V, alpha=1.0, max_len=3)
    assert got[0] == exhaustive_best(model, src, max_len=3, alpha=1.0)


def test_beams_are_searched_per_sentence_in_a_batch():
    model = make_model(seed=5)
    src = padded_src(5)
    batched = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=4, alpha=0.6, max_len=12)
    single = [beam_search(model, src[i : i + 1], bos_id=BOS, eos_id=EOS, beam_size=4, alpha=0.6, max_len=12)[0]
              for i in range(src.shape[0])]  # fmt: skip
    assert batched == single


def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(7, 1.0) == pytest.approx(2.0)  # (5 + 7) / 6
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(make_model(), padded_src(), bos_id=BOS, eos_id=EOS, beam_size=0, alpha=0.0, max_len=5)
