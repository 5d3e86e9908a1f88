"""The attention-logit controls (``model.attn_gate``, ``attn_sink``, ``attn_softmax``, ``attn_softcap``,
``final_softcap``): hand-computed values, the written-out path against SDPA, masks, the KV cache, causality, padding,
combinations with placements and QK-norm, config errors, and a short run of each on the default model. The
side-by-side checks against Hugging Face's modules are in tests/test_hf_attention_controls.py."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

import train as train_module
from analysis.presets import preset_keys, preset_used
from model.attention import KVCache, MultiHeadAttention
from model.attn_weights import soft_cap, softmax_with_sink, softpick
from model.config import ModelConfig, NormConfig
from model.transformer import DecoderCache, EncoderDecoder
from runlog.metric_names import matrix_site
from tests.helpers.config import make_cfg
from tests.reference.softpick import official_softpick
from training.muon import hidden_matrices
from training.schema import validate

D, H, B = 32, 4, 3
K = D // H
CONTROLS = {
    "gate elementwise": {"attn_gate": "elementwise"},
    "gate headwise": {"attn_gate": "headwise"},
    "sink": {"attn_sink": True},
    "softpick": {"attn_softmax": "softpick"},
    "softcap": {"attn_softcap": 2.0, "final_softcap": 3.0},
    "gate + sink + softcap": {"attn_gate": "elementwise", "attn_sink": True, "attn_softcap": 2.0},
    "gate + softpick + softcap": {"attn_gate": "headwise", "attn_softmax": "softpick", "attn_softcap": 2.0},
}
# Placements and attention norms the controls are combined with: pre, post, sandwich with per-head QK-norm, OLMo 2's
# full-width QK-norm after the branch, l2 QK-norm with its learned temperature.
NORMS = {
    "pre": NormConfig(),
    "post": NormConfig(placement="post"),
    "sandwich qk": NormConfig(kind="rmsnorm", placement="sandwich", qk="rmsnorm"),
    "res_post qk full": NormConfig(kind="rmsnorm", placement="res_post", qk="rmsnorm", qk_scope="full"),
    "pre qk l2": NormConfig(qk="l2"),
}
BOS, PAD = 1, 0


def make_model(norm: NormConfig | None = None, seed: int = 0, **controls) -> EncoderDecoder:
    torch.manual_seed(seed)
    norm = norm or NormConfig()
    cfg = ModelConfig(src_vocab=20, tgt_vocab=24, d_model=D, n_heads=H, d_ff=64, n_enc_layers=2, n_dec_layers=2,
                      dropout=0.0, max_len=40, norm=norm, **controls)  # fmt: skip
    model = EncoderDecoder(cfg).eval()
    with torch.no_grad():  # the sinks, gates and biases off their near-zero init, so that they matter
        for name, p in model.named_parameters():
            if "sinks" in name or "gate_proj" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p))
    return model


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    src, tgt = torch.randint(4, 20, (B, 9)), torch.randint(3, 24, (B, 12))
    src[1, 5:] = PAD
    tgt[:, 0] = BOS
    return src, tgt


def test_softpick_gives_hand_computed_weights():
    # exp(x) - 1 = [0, 1, 2] -> [0, 1/3, 2/3]; [-0.5, 2] -> [0, 2 / 2.5]; a hidden key counts nowhere.
    x = torch.tensor([[0.0, math.log(2), math.log(3)], [math.log(0.5), math.log(3), -math.inf]])
    expected = torch.tensor([[0.0, 1 / 3, 2 / 3], [0.0, 2 / 2.5, 0.0]])
    torch.testing.assert_close(softpick(x), expected, atol=1e-7, rtol=0)
    # every logit <= 0: every weight 0, the row sums to 0 (softmax would give 1)
    assert torch.equal(softpick(torch.tensor([[-1.0, -2.0, 0.0]])), torch.zeros(1, 3))


def test_softpick_equals_the_official_function_and_gives_zeros_where_it_gives_nan():
    torch.manual_seed(0)
    x = torch.randn(B, H, 7, 9) * 4
    x[0, :, :, 5:] = -math.inf  # padding keys
    x[1, 0, 2] = -math.inf  # a query that sees no key
    mine, theirs = softpick(x), official_softpick(x)
    seen = torch.isfinite(x).any(-1)
    torch.testing.assert_close(mine[seen], theirs[seen], atol=1e-7, rtol=1e-6)
    assert theirs[~seen].isnan().all() and torch.equal(mine[~seen], torch.zeros_like(mine[~seen]))


@pytest.mark.parametrize("top", [-50.0, -85.0, -89.0, -1000.0])
def test_softpick_s_gradient_is_finite_where_the_official_one_is_nan_and_equal_elsewhere(top):
    # a row whose largest logit is below -88.72: exp(-m) overflows float32, and the official code's backward is NaN
    # (at lr >= 0.03 this is what made every softpick run of finding (j) diverge at its commit); ours is 0, the true one
    rows = torch.tensor([[top, top - 5.0, top - 20.0], [1.0, -2.0, 0.5]])
    grads = []
    for fn in (softpick, official_softpick):
        x = rows.clone().requires_grad_(True)
        (fn(x) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
        grads.append(x.grad)
    mine, theirs = grads
    assert torch.equal(softpick(rows), official_softpick(rows))  # the weights: 0 for the low row, the same elsewhere
    assert torch.equal(mine[0], torch.zeros(3)) and torch.equal(mine[1], theirs[1])
    assert theirs[0].isnan().any() == (top < -88.72)


def test_the_sink_takes_its_share_of_the_softmax():
    # two keys at logit 0 and a sink at 0: a third each; a sink at -inf: the plain softmax
    x = torch.zeros(1, 2, 1, 2)
    w = softmax_with_sink(x, torch.tensor([0.0, -math.inf]))
    torch.testing.assert_close(w, torch.tensor([[[[1 / 3, 1 / 3]], [[0.5, 0.5]]]]), atol=1e-7, rtol=0)


def test_soft_cap_is_c_tanh_x_over_c():
    x = torch.tensor([-1e4, -3.0, 0.0, 0.5, 3.0, 1e4])
    torch.testing.assert_close(soft_cap(x, 2.0), 2.0 * torch.tanh(x / 2.0))
    assert soft_cap(x, 2.0).abs().max() <= 2.0 and abs(soft_cap(torch.tensor(0.01), 50.0) - 0.01) < 1e-8


@pytest.mark.parametrize("causal", [False, True])
def test_the_written_out_path_equals_sdpa(causal):
    """``weights`` with the plain softmax, fed what SDPA gets (padding, a causal mask shifted by a cached prefix), gives
    SDPA's output: the path every other control takes is checked where SDPA exists."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, 0.0, causal=causal).eval()
    x, pad = torch.randn(B, 6, D), torch.zeros(B, 6, dtype=torch.bool)
    pad[1, 4:] = True
    with torch.no_grad():
        sdpa = attn(x, key_pad_mask=None if causal else pad)
        attn.eager = True
        torch.testing.assert_close(attn(x, key_pad_mask=None if causal else pad), sdpa, atol=1e-6, rtol=0)
        if causal:  # 4 positions, then 2 more after the cached prefix
            cache = KVCache()
            steps = [attn(x[:, :4], cache=cache), attn(x[:, 4:], cache=cache)]
            torch.testing.assert_close(torch.cat(steps, 1), sdpa, atol=1e-6, rtol=0)


@pytest.mark.parametrize("norm", NORMS.values(), ids=NORMS.keys())
@pytest.mark.parametrize("controls", CONTROLS.values(), ids=CONTROLS.keys())
def test_cached_decoding_equals_full_recomputation(controls, norm):
    model = make_model(norm, **controls)
    src, tgt = batch()
    src_pad_mask = src.eq(PAD)
    with torch.no_grad():
        memory = model.encode(src, src_pad_mask)
        full = model.decode(tgt, memory, src_pad_mask)
        cache = DecoderCache(len(model.decoder))
        steps = [model.decode(tgt[:, t : t + 1], memory, src_pad_mask, cache) for t in range(9)]
        steps.append(model.decode(tgt[:, 9:], memory, src_pad_mask, cache))  # a block after a cached prefix
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    # the control is on: the same weights without it give other logits
    plain = make_model(norm)
    plain.load_state_dict(model.state_dict(), strict=False)
    assert not torch.allclose(plain(src, tgt), model(src, tgt), atol=1e-3)


@pytest.mark.parametrize("controls", CONTROLS.values(), ids=CONTROLS.keys())
def test_the_decoder_stays_causal_and_src_padding_changes_nothing(controls):
    model = make_model(**controls)
    src, tgt = batch()
    changed = tgt.clone()
    changed[:, 6:] = torch.randint(3, 24, (B, 6))
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
        torch.testing.assert_close(a[:, :6], b[:, :6], atol=1e-6, rtol=0)
        assert not torch.allclose(a[:, 6:], b[:, 6:])
        padded = torch.cat([src, torch.zeros(B, 4, dtype=torch.long)], 1)
        torch.testing.assert_close(model(padded, tgt), a, atol=1e-5, rtol=0)  # float32 rounding of sums over 9 vs 13 keys


@pytest.mark.parametrize("controls", CONTROLS.values(), ids=CONTROLS.keys())
def test_a_fully_padded_src_row_gives_finite_outputs_and_gradients(controls):
    model = make_model(**controls).train()
    src, tgt = batch()
    src[0] = PAD  # every key of sentence 0's cross-attention hidden
    model(src, tgt).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_final_softcap_caps_the_output_logits_only():
    capped = make_model(final_softcap=3.0)
    plain = make_model()
    plain.load_state_dict(capped.state_dict())  # no parameter of its own
    src, tgt = batch()
    with torch.no_grad():
        raw = plain(src, tgt)
        torch.testing.assert_close(capped(src, tgt), 3.0 * torch.tanh(raw / 3.0))
        assert raw.abs().max() > 3.0 > capped(src, tgt).abs().max()


def test_the_controls_add_their_parameters_and_leave_the_default_state_dict_alone():
    names = set(make_model().state_dict())
    gated = set(make_model(attn_gate="headwise", attn_sink=True).state_dict()) - names
    # 2 encoder self-attentions + 2 decoder self- and 2 cross-attentions, each with its gate and sinks
    assert len(gated) == 6 * 3 and {n.rsplit(".", 1)[-1] for n in gated} == {"weight", "bias", "sinks"}
    attn = make_model(attn_gate="headwise", attn_sink=True).decoder[0].cross_attn.branch
    assert attn.gate_proj.weight.shape == (H, D) and attn.sinks.shape == (H,)
    assert make_model(attn_gate="elementwise").encoder[0].self_attn.branch.gate_proj.weight.shape == (D, D)
    assert set(make_model(attn_softmax="softpick", attn_softcap=5.0, final_softcap=5.0).state_dict()) == names


BAD = [
    ({"attn_gate": "channel"}, "unknown model.attn_gate 'channel'; valid: null, elementwise, headwise"),
    ({"attn_softmax": "sparsemax"}, "unknown model.attn_softmax 'sparsemax'; valid: softmax, softpick"),
    ({"attn_sink": "yes"}, "model.attn_sink must be true or false, got 'yes'"),
    ({"attn_sink": True, "attn_softmax": "softpick"}, "model.attn_softmax=softpick has none"),
    ({"attn_softcap": 0.0}, "model.attn_softcap must be null (no cap) or a positive number, got 0.0"),
    ({"final_softcap": -30}, "model.final_softcap must be null (no cap) or a positive number, got -30"),
    ({"final_softcap": math.inf}, "model.final_softcap must be null (no cap) or a positive number, got inf"),
]


@pytest.mark.parametrize(("controls", "message"), BAD)
def test_a_bad_control_names_the_value_and_the_choices(controls, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(src_vocab=20, tgt_vocab=20, **controls)


MHA_ARGS = {"attn_gate": "gate", "attn_sink": "sink", "attn_softmax": "softmax", "attn_softcap": "softcap"}


@pytest.mark.parametrize(("controls", "message"), [(c, m) for c, m in BAD if "final_softcap" not in c])
def test_the_attention_module_refuses_a_bad_control_as_the_config_does(controls, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MultiHeadAttention(16, 2, 0.0, **{MHA_ARGS[k]: v for k, v in controls.items()})


@pytest.mark.parametrize(
    "overrides",
    [["model.attn_gate=elementwise"], ["model.attn_gate=headwise"], ["model.attn_sink=true"],
     ["model.attn_softmax=softpick"], ["model.attn_softcap=50.0", "model.final_softcap=30.0"]],
)  # fmt: skip
def test_each_control_trains_the_default_model(overrides, tmp_path):
    train_module.train(make_cfg("model=small", *overrides), tmp_path)
    rows = [line for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"train/loss"' in line]
    losses = [json.loads(r)["train/loss"] for r in rows]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.2


def test_the_gate_is_a_block_matrix_to_muon_weight_decay_and_the_weight_telemetry():
    model = make_model(attn_gate="elementwise")
    gate = model.decoder[1].cross_attn.branch.gate_proj.weight
    assert any(p is gate for p in hidden_matrices(model))
    assert model.decoder[1].cross_attn.branch.linear_roles()["attn.gate"].weight is gate
    assert matrix_site("cross_attn", "attn.gate") == "cross_attn.gate"


def test_qk_clip_refuses_soft_capped_logits_in_one_line():
    with pytest.raises(ValueError, match=r"^optim.qk_clip compares .* model.attn_softcap=50.0 caps them first"):
        validate(make_cfg("optim=muon_qk_clip", "model.attn_softcap=50.0"))
    assert validate(make_cfg("optim=muon_qk_clip", "model.final_softcap=30.0")).model.final_softcap == 30.0


@pytest.mark.parametrize(("preset", "model_keys"), [("gemma2", {"model.attn_softcap": 50.0, "model.final_softcap": 30.0}),
                                                    ("qwen3next", {"model.attn_gate": "elementwise"})])  # fmt: skip
def test_a_run_is_named_by_a_top_level_preset_only_with_its_model_keys(preset, model_keys):
    """gemma2 and qwen3next set model keys too: a run holding their norm keys but not their caps or gate is not theirs."""
    norm = {k: v for k, v in preset_keys(preset).items() if k.startswith("norm.")}
    with_model = SimpleNamespace(label="x", runs=[SimpleNamespace(config={**norm, **model_keys})])
    without = SimpleNamespace(label="x", runs=[SimpleNamespace(config=norm)])  # an old run: model keys read as ADDED's
    assert {k: v for k, v in preset_keys(preset).items() if k.startswith("model.")} == model_keys
    assert preset_used(with_model) == preset and preset_used(without) != preset
