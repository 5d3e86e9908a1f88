"""Attention weights from pre-softmax logits, for the controls SDPA has no kernel for: soft-capping, a learned sink
and softpick (``model.attn_softcap``, ``model.attn_sink``, ``model.attn_softmax``; docs/attention.md).

Shape legend: B batch, H heads, T queries, S keys. Every function takes the logits (B, H, T, S) float32 with -inf at
the keys a query may not see (``MultiHeadAttention.logits``'s default fill) and returns the weights (B, H, T, S) that
multiply the values. A query that sees no key gets all-zero weights, never NaN, as it does from SDPA.
"""

import torch
import torch.nn.functional as F

# Softpick's eps, the official code's default (zaydzuhri/softpick-attention, naive_softpick_attn.py): it only matters
# when every |exp(x) - 1| of a row is 0.
SOFTPICK_EPS = 1e-8
# The least row maximum m softpick scales by: exp(-m) overflows float32 (and bfloat16) below m = -88.72, and the
# official code's backward is then NaN (0 * inf) though every weight of the row is 0 (``softpick``'s docstring).
SOFTPICK_MIN_SHIFT = -80.0


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(x / cap)``: x squashed into (-cap, cap), about x where |x| << cap (Gemma Team 2024, "Gemma 2",
    arXiv 2408.00118, sec. 2, "Logit soft-capping"; Hugging Face ``models/gemma2/modeling_gemma2.py``). Any shape;
    -inf maps to -cap, so it is applied before the mask."""
    return cap * torch.tanh(x / cap)


def softmax(logit: torch.Tensor) -> torch.Tensor:
    """The softmax over keys, as SDPA computes it, with zeros for a query that sees no key."""
    seen = torch.isfinite(logit).any(-1, keepdim=True)  # (B, H, T, 1)
    return torch.where(seen, torch.softmax(logit, -1), 0.0)


def softmax_with_sink(logit: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """The softmax over the keys and one learned logit per head, the sink, whose weight is dropped: row t's weights
    are exp(x_ts) / (exp(s_h) + sum_s' exp(x_ts')) and sum to less than 1 (the attention sinks of OpenAI 2025,
    "gpt-oss-120b & gpt-oss-20b Model Card"; Hugging Face ``models/gpt_oss/modeling_gpt_oss.py``,
    ``eager_attention_forward``). ``sink``: (H,)."""
    B, H, T, _ = logit.shape
    sinks = sink.float().reshape(1, H, 1, 1).expand(B, H, T, 1)
    return torch.softmax(torch.cat([logit, sinks], -1), -1)[..., :-1]


def softpick(logit: torch.Tensor, eps: float = SOFTPICK_EPS) -> torch.Tensor:
    """The rectified softmax ``relu(exp(x_s) - 1) / sum_s' |exp(x_s') - 1|`` over the keys a query sees (Zuhri et
    al. 2025, "Softpick: No Attention Sinks, No Massive Activations with Rectified Softmax", arXiv 2504.20966).
    Computed as the official code does (zaydzuhri/softpick-attention, ``softpick``): numerator and denominator times
    exp(-m), m the row's largest logit, so exp(x - m) never overflows, and ``eps`` added to the scaled denominator. A
    weight is 0 where x <= 0; a row's weights sum to at most 1, to 0 when every logit is <= 0.

    One difference: m is at least ``SOFTPICK_MIN_SHIFT`` (-80). Where the row's largest logit is below -88.72,
    exp(-m) overflows float32 and the official code's gradient is NaN (0 * inf through m), which trained weights turn
    into NaN; such a row's weights are all 0 and their gradient is 0, which the floor gives. Every other row is
    computed exactly as before (m unchanged above -80; between -88.72 and -80 the weights and gradients are 0 both
    ways), so only a run that met such a row trains differently (``tests/test_attention_controls.py``)."""
    seen = torch.isfinite(logit)
    m = logit.amax(-1, keepdim=True)  # (B, H, T, 1)
    m = torch.where(torch.isfinite(m), m, 0.0)  # a query that sees no key: any finite m gives it zeros
    m = m.clamp_min(SOFTPICK_MIN_SHIFT)
    shifted = torch.exp(logit - m) - torch.exp(-m)  # (exp(x) - 1) * exp(-m); -exp(-m) at a hidden key
    return F.relu(shifted) / (torch.where(seen, shifted.abs(), 0.0).sum(-1, keepdim=True) + eps)
