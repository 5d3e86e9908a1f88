"""Batched beam search with the incremental decoder cache; greedy decoding is beam size 1.

Shape legend: B sentences, N sentences still searching (N <= B), k beam size, S src length,
V tgt vocabulary, t tokens decoded so far.

The search follows fairseq's ``SequenceGenerator``: each step scores every one-token extension
of the k live hypotheses of a sentence (summed log-probabilities) and keeps the best 2k. Those of
the top k that end in EOS are finished; the first k that do not are the next live hypotheses
(at most k of the 2k end in EOS, one per live hypothesis, so k always remain). A sentence stops
when it has k finished hypotheses, or at ``max_len`` tokens, where its live ones are finished
as they are. The answer is the finished hypothesis with the best length-normalized score

    score(Y) = log P(Y | X) / lp(Y),   lp(Y) = ((5 + |Y|) / 6) ** alpha

(GNMT, Wu et al. 2016, arXiv 1609.08144, sec. 7, eq. 14; |Y| counts the EOS; alpha = 0 ranks by
log-probability). With k = 1 every step keeps the argmax token, i.e. greedy decoding.
"""

import torch

from model.transformer import DecoderCache, EncoderDecoder


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, eq. 14)."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(
    model: EncoderDecoder,
    src: torch.Tensor,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int,
    alpha: float,
    max_len: int,
) -> list[list[int]]:
    """Decode each row of ``src``; the best hypothesis of each, without BOS and EOS.

    Args:
        model: the encoder-decoder (put it in eval mode first).
        src: (B, S) ids, right-padded with ``model.cfg.pad_id``.
        bos_id, eos_id: begin/end-of-sequence ids of the target vocabulary.
        beam_size: k >= 1; 1 is greedy decoding.
        alpha: length-penalty exponent (see the module docstring).
        max_len: most tokens generated per sentence (EOS included); at most ``cfg.max_len - 1``.

    Returns:
        B lists of token ids; a hypothesis cut at ``max_len`` has no EOS to drop.

    Raises:
        ValueError: beam_size < 1 or max_len < 1.
    """
    if beam_size < 1 or max_len < 1:
        raise ValueError(f"beam_size and max_len must be >= 1, got {beam_size} and {max_len}")
    k, max_len = beam_size, min(max_len, model.cfg.max_len - 1)
    src_pad_mask = src.eq(model.cfg.pad_id)  # (B, S)
    memory = model.encode(src, src_pad_mask).repeat_interleave(k, 0)  # (B * k, S, D)
    src_pad_mask = src_pad_mask.repeat_interleave(k, 0)  # (B * k, S)
    B, device = src.shape[0], src.device
    cache = DecoderCache(len(model.decoder))
    sentence = torch.arange(B)  # (N,) which input row each searching sentence is
    tokens = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)  # (N * k, 1 + t)
    scores = torch.zeros(B, k, device=device)  # (N, k) log P of each live hypothesis
    scores[:, 1:] = float("-inf")  # all k start as the same BOS: expand only the first
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for step in range(max_len):
        last = step == max_len - 1
        logits = model.decode(tokens[:, -1:], memory, src_pad_mask, cache)[:, -1]  # (N * k, V)
        top_scores, beam, tok = _best_extensions(logits, scores, k)
        is_eos = tok.eq(eos_id)
        _finish(finished, sentence, tokens, top_scores, beam, tok, is_eos, last, length_penalty(step + 1, alpha))
        if last:
            break
        scores, rows, new_tok = _live_extensions(top_scores, beam, tok, is_eos)
        tokens = torch.cat([tokens[rows], new_tok], dim=1)
        cache.select(rows, cross=False)  # beams move within a sentence, whose memory rows are equal
        searching = torch.tensor([len(finished[int(b)]) < k for b in sentence], device=device)  # (N,)
        if not searching.any():
            break
        if not searching.all():  # drop finished sentences from the batch
            keep = searching.repeat_interleave(k)  # (N * k,)
            sentence, scores = sentence[searching.cpu()], scores[searching]
            tokens, memory, src_pad_mask = tokens[keep], memory[keep], src_pad_mask[keep]
            cache.select(keep.nonzero()[:, 0])
    return [max(hyps, key=lambda h: h[0])[1] for hyps in finished]


def _best_extensions(logits: torch.Tensor, scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best 2k one-token extensions of each sentence's k live hypotheses, best first.

    ``logits``: (N * k, V) of the next token; ``scores``: (N, k) log P of each live hypothesis. Returns (N, 2k) each:
    the extension's summed log P, the live hypothesis (0..k-1) it extends, and its new token."""
    N, V = scores.shape[0], logits.shape[-1]
    logp = logits.float().log_softmax(-1).view(N, k, V)
    top_scores, top = (scores[:, :, None] + logp).view(N, k * V).topk(2 * k, dim=1)  # (N, 2k)
    return top_scores, top // V, top % V


def _finish(
    finished: list[list[tuple[float, list[int]]]],
    sentence: torch.Tensor,
    tokens: torch.Tensor,
    top_scores: torch.Tensor,
    beam: torch.Tensor,
    tok: torch.Tensor,
    is_eos: torch.Tensor,
    last: bool,
    lp: float,
) -> None:
    """Append to ``finished`` (per input row: (length-normalized score, ids without BOS and EOS)) the candidates that
    end here: those of the top k that end in EOS, and on the ``last`` step all of the top k.

    ``sentence``: (N,) input rows; ``tokens``: (N * k, 1 + t); the rest (N, 2k) from ``_best_extensions``; ``lp``:
    the length penalty of this step's length."""
    k = tokens.shape[0] // len(sentence)
    done = is_eos.clone()
    done[:, k:] = False  # an EOS below the top k is worse than k live hypotheses
    if last:
        done[:, :k] = True
    for n, j in done.nonzero().tolist():
        prefix = tokens[n * k + beam[n, j], 1:].tolist()
        hyp = prefix if is_eos[n, j] else prefix + [int(tok[n, j])]
        finished[int(sentence[n])].append((float(top_scores[n, j]) / lp, hyp))


def _live_extensions(
    top_scores: torch.Tensor, beam: torch.Tensor, tok: torch.Tensor, is_eos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The next k live hypotheses of each sentence: the first k candidates (N, 2k) that do not end in EOS (nonzero
    keeps them in score order). Returns their (N, k) scores, the (N * k,) rows of ``tokens`` they extend, and their
    (N * k, 1) new tokens."""
    N, k = top_scores.shape[0], top_scores.shape[1] // 2
    live = ~is_eos & ((~is_eos).cumsum(1) <= k)  # (N, 2k), k True per row
    cols = live.nonzero()[:, 1].view(N, k)
    rows = (torch.arange(N, device=beam.device)[:, None] * k + beam.gather(1, cols)).view(-1)  # (N * k,)
    return top_scores.gather(1, cols), rows, tok.gather(1, cols).view(-1, 1)
