"""Attention statistics from the pre-softmax logits and the weights, as the model itself writes them out.

``attn/{s}.{i}.{a}/entropy``: the softmax entropy in nats of each real query's row, mean over heads and
real queries; ``attn/{s}.{i}.{a}/max_logit``: the largest logit over heads, real queries and the keys
they see (``{a}``: ``self_attn`` or ``cross_attn``), and ``attn/{s}.{i}.{a}.h{k}/max_logit`` head k's, the
S_h that QK-Clip compares with tau (``training.qk_clip``). All come from one
:meth:`model.attention.MultiHeadAttention.logits` per attention and step, fed the q and k that SDPA
received (hooks on the attention's ``q_tap`` and ``k_tap``) and the key padding mask the attention was
called with, so the scale (q.k / sqrt(K), or g * cos(q, k) with l2 QK-norm), the masks and the KV cache
are the model's own; ``attn/{s}.{i}.{a}/sink_mass``, the share of attention on the first key, from the weights of the
same logits (:meth:`~model.attention.MultiHeadAttention.normalize`: a learned sink's or softpick's included). Definitions and
Gaussian baselines: docs/telemetry.md.
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from model.attention import MultiHeadAttention
from model.transformer import EncoderDecoder
from runlog.metric_names import ATTENTIONS, attn_max_logit, attn_stat
from telemetry.config import TelemetryConfig
from telemetry.core import DeviceStats, blocks

# A hidden key's logit: a large finite negative, not -inf, so that exp() gives exactly 0 and 0 * logit
# stays 0 instead of NaN in the entropy's sum over keys.
HIDDEN = -1e9


class AttentionStats:
    """``attn/.../entropy`` and ``attn/.../max_logit`` of the forward passes run while :meth:`hooks`'
    handles exist, written into ``stats``."""

    def __init__(self, model: EncoderDecoder, cfg: TelemetryConfig, stats: DeviceStats) -> None:
        self.model = model
        self.cfg = cfg
        self.stats = stats

    def hooks(self, src_pad_mask: torch.Tensor, tgt_pad_mask: torch.Tensor) -> list[RemovableHandle]:
        """Register the hooks of every attention (none when both statistics are off); the caller removes them.

        Args:
            src_pad_mask: (B, S) bool, True at src padding: the encoder's padding queries.
            tgt_pad_mask: (B, T) bool, True at tgt padding: the decoder's padding queries.
        """
        if not (self.cfg.attn_entropy or self.cfg.attn_max_logit or self.cfg.attn_sink_mass):
            return []
        handles = []
        for stack, i, layer in blocks(self.model):
            queries = ~(tgt_pad_mask if stack == "dec" else src_pad_mask)
            for r in (r for r in ATTENTIONS if hasattr(layer, r)):
                handles += self._hooks(stack, i, r, getattr(layer, r).branch, queries)
        return handles

    def _hooks(self, stack: str, i: int, r: str, attn: MultiHeadAttention, queries: torch.Tensor) -> list:
        """One :meth:`MultiHeadAttention.logits` per call of ``attn`` (:func:`logit_hooks`) gives the configured
        ``attn/{stack}.{i}.{r}/entropy`` and ``.../max_logit``, and the weights of those logits its ``sink_mass``.

        Args:
            queries: (B, T) bool, True at the real (non-padding) queries.
        """

        def on_weights(w: torch.Tensor) -> None:
            self.stats[attn_stat(stack, i, r, "sink_mass").name] = sink_mass(w, queries)

        def on_logits(logit: torch.Tensor) -> None:
            top = logit.amax(-1, keepdim=True)  # (B, H, T, 1): each query sees a real key, so a real logit
            if self.cfg.attn_max_logit:
                heads = head_max_logits(top.squeeze(-1), queries)
                self.stats[attn_max_logit(stack, i, r).name] = heads.amax()
                for h, value in enumerate(heads.unbind()):
                    self.stats[attn_max_logit(stack, i, r, h).name] = value
            if self.cfg.attn_entropy:
                self.stats[attn_stat(stack, i, r, "entropy").name] = _mean_entropy(logit - top, queries)

        logits = on_logits if self.cfg.attn_entropy or self.cfg.attn_max_logit else None
        return logit_hooks(attn, logits, on_weights if self.cfg.attn_sink_mass else None)


def logit_hooks(
    attn: MultiHeadAttention,
    on_logits: Callable[[torch.Tensor], None] | None,
    on_weights: Callable[[torch.Tensor], None] | None = None,
) -> list[RemovableHandle]:
    """Hooks that hand ``on_logits`` the pre-softmax logits (B, H, T, S) float32 of every call of ``attn``, hidden
    keys at ``HIDDEN``, and ``on_weights`` its attention weights (B, H, T, S) float32 (None: not computed), under
    ``no_grad``: hooks on its q/k taps see what SDPA received (no second projection), one on ``attn`` itself its key
    padding mask, and one :meth:`MultiHeadAttention.logits` per call writes them out (the weights from the same logits,
    :meth:`MultiHeadAttention.normalize`). The caller removes the handles. Used by :class:`AttentionStats` and by
    QK-Clip (``training.qk_clip``)."""
    seen: dict[str, torch.Tensor] = {}

    def tap(key: str):
        def hook(mod: nn.Module, args: tuple, out: torch.Tensor) -> None:
            seen[key] = out.detach()

        return hook

    @torch.no_grad()
    def on_attention(mod: MultiHeadAttention, args: tuple, out: torch.Tensor) -> None:
        key_pad = args[2] if len(args) > 2 else None  # (B, S) or None: forward(x, memory, key_pad_mask, ...)
        logit = mod.logits(seen.pop("q"), seen.pop("k"), key_pad)  # hidden keys at -inf, as the weights need them
        if on_logits is not None:
            on_logits(logit.clamp_min(HIDDEN))
        if on_weights is not None:
            on_weights(mod.normalize(logit))

    return [
        attn.q_tap.register_forward_hook(tap("q")),
        attn.k_tap.register_forward_hook(tap("k")),
        attn.register_forward_hook(on_attention),
    ]


def head_max_logits(row_max: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Each head's largest logit over the real queries and the keys they see.

    Args:
        row_max: (B, H, T) each query's largest logit over the keys it sees (hidden keys excluded).
        queries: (B, T) bool, True at the real (non-padding) queries.

    Returns:
        (H,) float32; -inf for a head when no query is real.
    """
    return row_max.masked_fill(~queries[:, None, :], -math.inf).amax((0, 2))


def sink_mass(w: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """The share of attention on the first key (position 0 of the keys: the first source token in cross-attention and
    the encoder, the first target token, BOS, in the decoder), mean over heads and real queries: the attention sink
    of Xiao et al. 2024 ("Efficient Streaming Language Models with Attention Sinks", ICLR, arXiv 2309.17453, sec. 3.1).
    Uniform attention gives the mean of 1 / (keys a query sees); docs/telemetry.md.

    Args:
        w: (B, H, T, S) the attention weights (:meth:`MultiHeadAttention.weights`); queries: (B, T) bool, True at the
            real queries.

    Returns:
        0-dim float32.
    """
    first = w[..., 0].mean(1)  # (B, T), mean over heads
    keep = queries.float()
    return (first * keep).sum() / keep.sum()


def _mean_entropy(z: torch.Tensor, keep_queries: torch.Tensor) -> torch.Tensor:
    """Mean over heads and real queries of the softmax entropy (nats) of each row of z.

    Args:
        z: (B, H, T, S) logits minus their row max (hidden keys at about ``HIDDEN``).
        keep_queries: (B, T) bool, True at the real queries.
    """
    # H(p) = log Z - sum_j p_j z_j with p = exp(z) / Z; cheaper than softmax + entr on rows as short as these.
    e = z.exp()
    Z = e.sum(-1)  # (B, H, T)
    ent = (Z.log() - (e * z).sum(-1) / Z).mean(1)  # (B, T), mean over heads
    w = keep_queries.float()
    return (ent * w).sum() / w.sum()
