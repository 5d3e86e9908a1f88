"""Per-head norm sites on queries, keys and values inside attention (off by default), and l2 QK-norm with a learned
temperature."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.attention import MultiHeadAttention
from model.kinds import NORM_KINDS
from model.norms import L2Norm, LayerNorm, RMSNorm
from model.transformer import DecoderCache, EncoderDecoder
from tests.helpers.config import make_cfg, model_config
from tests.helpers.model import randomize_norms
from training.schema import validate

V = 43


def test_qkv_norm_attention_equals_normalize_per_head_then_softmax():
    torch.manual_seed(0)
    B, T, S, D, H = 2, 5, 7, 16, 2
    K = D // H
    attn = MultiHeadAttention(D, H, 0.0, q_norm=LayerNorm(K, 1e-5), k_norm=LayerNorm(K, 1e-5), v_norm=RMSNorm(K, 1e-5)).eval()
    randomize_norms(attn)
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D) * 3
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, 4:] = True

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(B, -1, H, K).transpose(1, 2)  # (B, H, L, K)

    qn, kn, vn = attn.q_norm, attn.k_norm, attn.v_norm
    q = F.layer_norm(heads(attn.q_proj(x)), (K,), qn.weight, qn.bias, eps=1e-5)  # LN over each head's K features
    k = F.layer_norm(heads(attn.k_proj(memory)), (K,), kn.weight, kn.bias, eps=1e-5)
    v = heads(attn.v_proj(memory))
    v = vn.weight * v / (v.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()  # RMSNorm over K
    scores = (q @ k.transpose(-1, -2) / math.sqrt(K)).masked_fill(pad[:, None, None, :], float("-inf"))  # (B, H, T, S)
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
    torch.testing.assert_close(attn(x, memory, pad), attn.out_proj(y), atol=1e-5, rtol=0)


def model_with(*overrides: str) -> EncoderDecoder:
    cfg = make_cfg(*overrides)
    validate(cfg)
    torch.manual_seed(0)
    return EncoderDecoder(model_config(cfg, V, V)).eval()


def test_default_builds_no_attention_norms():
    model = model_with()
    for attn in (m for m in model.modules() if isinstance(m, MultiHeadAttention)):
        assert all(isinstance(getattr(attn, site), nn.Identity) for site in ("q_norm", "k_norm", "v_norm"))
    assert not [name for name, _ in model.named_parameters() if "_norm." in name and ".branch." in name]


def test_norm_keys_put_norms_over_d_head_in_every_attention():
    model = model_with("norm.qk=rmsnorm", "norm.v=layernorm")
    d_head = model.cfg.d_model // model.cfg.n_heads
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters() if "_norm." in name and ".branch." in name}
    assert shapes["decoder.1.cross_attn.branch.k_norm.weight"] == (d_head,)
    assert shapes["encoder.0.self_attn.branch.v_norm.bias"] == (d_head,)
    n_attn = model.cfg.n_enc_layers + 2 * model.cfg.n_dec_layers
    assert len(shapes) == n_attn * 4  # q, k (RMSNorm: weight) and v (LayerNorm: weight, bias)
    assert isinstance(model.decoder[0].self_attn.branch.q_norm, RMSNorm)


def test_per_block_attention_norms_follow_the_plan():
    model = model_with("norm.blocks=[{stack: enc, layers: [1], qk: layernorm}]")
    assert isinstance(model.encoder[1].self_attn.branch.k_norm, LayerNorm)
    assert isinstance(model.encoder[0].self_attn.branch.k_norm, nn.Identity)
    assert isinstance(model.decoder[1].cross_attn.branch.q_norm, nn.Identity)


@pytest.mark.parametrize(
    "overrides",
    [("norm.qk=layernorm",), ("norm.qk=rmsnorm", "norm.v=rmsnorm", "norm=post_ln"), ("norm.qk=l2", "norm.v=l2"), ("norm=olmo2",),
     ("norm=gemma3",)],
)  # fmt: skip
def test_incremental_decoding_equals_full_decoding_and_normalizes_the_source_once(overrides):
    model = model_with(*overrides)
    randomize_norms(model)
    torch.manual_seed(1)
    src, tgt = torch.randint(4, V, (3, 6)), torch.randint(4, V, (3, 5))
    src[2, 3:] = 0
    mask = src.eq(0)
    calls = {"cross_k": 0, "self_k": 0}
    hooks = [
        model.decoder[0].cross_attn.branch.k_norm.register_forward_hook(
            lambda *_: calls.__setitem__("cross_k", calls["cross_k"] + 1)
        ),
        model.decoder[0].self_attn.branch.k_norm.register_forward_hook(
            lambda *_: calls.__setitem__("self_k", calls["self_k"] + 1)
        ),
    ]
    with torch.no_grad():
        memory = model.encode(src, mask)
        cache = DecoderCache(len(model.decoder))
        steps = torch.cat([model.decode(tgt[:, t : t + 1], memory, mask, cache) for t in range(tgt.shape[1])], dim=1)
        assert calls == {"cross_k": 1, "self_k": tgt.shape[1]}  # the source's keys once; each new target key once
        full = model.decode(tgt, memory, mask)
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=0)


def test_l2_qk_logits_are_temperature_times_cosine_and_the_output_a_hand_softmax():
    torch.manual_seed(0)
    B, T, S, D, H = 2, 5, 7, 16, 2
    K = D // H
    attn = MultiHeadAttention(D, H, 0.0, q_norm=L2Norm(D // H, 1e-6), k_norm=L2Norm(D // H, 1e-6), temperature=10.0).eval()
    with torch.no_grad():
        attn.temperature.fill_(7.3)  # off its init, so a hand computation that assumed 10 would differ
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D) * 3
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, 4:] = True
    taps = {}
    attn.q_tap.register_forward_hook(lambda m, i, o: taps.__setitem__("q", o))
    attn.k_tap.register_forward_hook(lambda m, i, o: taps.__setitem__("k", o))
    out = attn(x, memory, pad)

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(B, -1, H, K).transpose(1, 2)  # (B, H, L, K)

    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(memory)), heads(attn.v_proj(memory))
    cos = (q @ k.transpose(-1, -2)) / (q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :])  # (B, H, T, S)
    logits = 7.3 * cos
    # Telemetry recomputes the logits as q.k / sqrt(K) from the taps: that is g * cos.
    torch.testing.assert_close(taps["q"] @ taps["k"].transpose(-1, -2) / math.sqrt(K), logits, atol=1e-5, rtol=0)
    assert logits.abs().max() <= 7.3 + 1e-5
    weights = logits.masked_fill(pad[:, None, None, :], float("-inf")).softmax(-1)
    y = (weights @ v).transpose(1, 2).reshape(B, T, D)
    torch.testing.assert_close(out, attn.out_proj(y), atol=1e-5, rtol=0)


def test_l2_qk_temperature_starts_at_10_and_learns():
    model = model_with("norm.qk=l2").train()
    temps = {name: p for name, p in model.named_parameters() if name.endswith("temperature")}
    n_attn = model.cfg.n_enc_layers + 2 * model.cfg.n_dec_layers
    assert len(temps) == n_attn and "decoder.1.cross_attn.branch.temperature" in temps
    assert all(p.shape == (1,) and p.item() == 10.0 for p in temps.values())
    assert isinstance(model.encoder[0].self_attn.branch.k_norm, L2Norm)
    src, tgt = torch.randint(4, V, (3, 6)), torch.randint(4, V, (3, 5))
    F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten()).backward()
    assert all(p.grad is not None and p.grad.abs().item() > 0 for p in temps.values())


@pytest.mark.parametrize("overrides", [("norm.qk=rmsnorm",), ("norm.v=l2",), ()])
def test_only_l2_queries_and_keys_get_a_temperature(overrides):
    model = model_with(*overrides)
    assert not [name for name, _ in model.named_parameters() if "temperature" in name]
    assert all(m.temperature is None for m in model.modules() if isinstance(m, MultiHeadAttention))


def test_qk_none_reproduces_the_attention_without_norms_bit_for_bit():
    off, none = model_with(), model_with("norm.qk=none")
    assert isinstance(none.encoder[0].self_attn.branch.q_norm, nn.Identity)
    a, b = off.state_dict(), none.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[key], b[key]) for key in a)
    torch.manual_seed(1)
    src, tgt = torch.randint(4, V, (3, 6)), torch.randint(4, V, (3, 5))
    with torch.no_grad():
        assert torch.equal(off(src, tgt), none(src, tgt))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("norm.qk=l3", r"unknown norm.qk 'l3'; valid: null \(off\), layernorm, rmsnorm, none, l2$"),
        ("norm.impl=native", r"norm.qk='l2' has no impl 'native'; valid kind/impl pairs: layernorm/custom, "),
    ],
)
def test_bad_qk_values_name_the_valid_ones(override, message):
    cfg = make_cfg("norm.qk=l2", override)
    with pytest.raises(ValueError, match=message):
        model_config(cfg, V, V)


def test_l2_is_not_a_residual_norm_kind():
    kinds = ", ".join(NORM_KINDS)
    message = rf"unknown norm.kind 'l2'; valid kinds: {kinds}$"
    with pytest.raises(ValueError, match=message):
        model_config(make_cfg("norm.kind=l2"), V, V)
