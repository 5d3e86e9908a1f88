"""Hyper-connections (``norm.hc``, ``model.residual_streams``): n = 1 parity with pre-LN, the papers' formulas,
mHC side by side with its reference (Hugging Face transformers' DeepSeek-V4 modules), the composite gain."""

import pytest
import torch

from model.config import HC_PLACEMENTS, ModelConfig, NormConfig
from model.hyper_connections import (
    MHC_EPS,
    SINKHORN_ITERS,
    HyperConnection,
    ManifoldHyperConnection,
    composite_gain,
    sinkhorn,
)
from model.transformer import EncoderDecoder

D = 16


def build(hc: str | None = None, n: int | None = None, placement: str = "pre") -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=20, tgt_vocab=20, d_model=D, n_heads=2, d_ff=32, n_enc_layers=2, n_dec_layers=2,
                      dropout=0.0, norm=NormConfig(hc=hc, placement=placement), residual_streams=n)  # fmt: skip
    return EncoderDecoder(cfg).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 20, (2, 6), generator=g), torch.randint(4, 20, (2, 5), generator=g)
    src[1, 4:] = 0
    return src, tgt


@pytest.mark.parametrize("hc", ["static", "dynamic"])
@pytest.mark.parametrize("placement", ["pre", "sandwich"])
def test_one_stream_at_init_is_the_plain_model_bit_for_bit(hc, placement):
    # HC eq. 14's init at n = 1: a_m = 1, A = 1, b = 1 (dynamic: W = 0, so tanh(.) = 0): x + u(x), same draws.
    src, tgt = batch()
    with torch.no_grad():
        assert torch.equal(build(hc, 1, placement)(src, tgt), build(placement=placement)(src, tgt))


def test_mhc_one_stream_with_zero_projections_is_pre_ln_up_to_its_eps():
    # mHC's n = 1 form is not exactly pre-LN: a_m = sigmoid(.) + eps (~0.5: the pre-LN norm_in absorbs it up to its
    # eps), b = 2 sigmoid(.) (1 only where phi_post x' + b_post = 0) and A = Sinkhorn(1 + eps) = 1 - O(eps). With phi = 0
    # (and the merge's) it matches pre-LN to ~1e-5; the draws of phi at init shift every later parameter draw.
    base, mhc = build(), build("mhc", 1)
    missing, unexpected = mhc.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and all(".hc." in k or "streams_merge" in k for k in missing)
    with torch.no_grad():
        for name, p in mhc.named_parameters():
            if name.endswith(".fn"):
                p.zero_()
        src, tgt = batch()
        expected = base(src, tgt)
        torch.testing.assert_close(mhc(src, tgt), expected, atol=1e-4, rtol=0)
        assert not torch.equal(mhc(src, tgt), expected)


def test_dynamic_hc_computes_the_paper_equations():
    # Zhu et al. eqs. 10-13 (weights) and 1-5 (mixing), written out with the module's parameters moved off their init.
    n = 3
    hc = HyperConnection(n, D, sublayer=4, dynamic=True)
    assert torch.equal(hc.static_alpha[:, 0], torch.tensor([0.0, 1.0, 0.0]))  # e_{4 mod 3}
    with torch.no_grad():
        for p in hc.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    h = torch.randn(2, 5, n * D)
    lin = torch.nn.Linear(D, D)
    H = h.view(2, 5, n, D)
    Hn = torch.nn.functional.layer_norm(H, (D,), hc.norm.weight, hc.norm.bias, eps=1e-5)
    a = hc.static_alpha + hc.alpha_scale * torch.tanh(Hn @ hc.alpha_fn)  # (2, 5, n, 1+n)
    b = hc.static_beta + hc.beta_scale * torch.tanh(Hn @ hc.beta_fn)  # (2, 5, n)
    h0 = sum(a[..., k, 0, None] * H[..., k, :] for k in range(n))
    f = lin(h0)
    out = torch.stack([b[..., j, None] * f + sum(a[..., k, 1 + j, None] * H[..., k, :] for k in range(n)) for j in range(n)], -2)
    with torch.no_grad():
        torch.testing.assert_close(hc(h, lin), out.flatten(-2), atol=1e-5, rtol=0)


def test_sinkhorn_reaches_doubly_stochastic_and_composite_gain_of_such_products_is_one():
    m = sinkhorn(torch.rand(5, 4, 4) + 0.1)
    torch.testing.assert_close(m.sum(-2), torch.ones(5, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(m.sum(-1), torch.ones(5, 4), atol=1e-3, rtol=0)
    fwd, bwd = composite_gain([torch.eye(3)[[1, 2, 0]], torch.full((3, 3), 1 / 3), torch.eye(3)])
    assert fwd.item() == pytest.approx(1.0) and bwd.item() == pytest.approx(1.0)
    # A = [[2, 0], [1, 1]] twice: M = (A^T)^2 = [[4, 3], [0, 1]]: rows 7, 1; columns 4, 4 (A^2 would give 4, 7).
    a = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    fwd, bwd = composite_gain([a, a])
    assert (fwd.item(), bwd.item()) == (7.0, 4.0)


def test_mhc_matches_deepseek_v4_reference_side_by_side():
    # transformers 5.23.0's DeepseekV4HyperConnection / DeepseekV4HyperHead and the decoder layer's update line
    # (post * F(.) + comb^T @ H), on the same input and weights.
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection, DeepseekV4HyperHead

    from model.hyper_connections import ManifoldHead

    torch.manual_seed(0)
    config = DeepseekV4Config(hidden_size=D, hc_mult=4)
    ref, ours = DeepseekV4HyperConnection(config), ManifoldHyperConnection(4, D)
    with torch.no_grad():
        ours.fn.normal_(std=0.3)
        ours.base.normal_()
        ours.scale.uniform_(0.5, 2.0)
        for name in ("fn", "base", "scale"):
            getattr(ref, name).copy_(getattr(ours, name))
        streams = torch.randn(2, 5, 4, D) * 3
        post, comb, collapsed = ref(streams)
        pre, post_ours, res = ours.weights(streams.flatten(-2))
        torch.testing.assert_close(post_ours, post, atol=1e-6, rtol=0)
        torch.testing.assert_close(res, comb, atol=1e-6, rtol=0)
        lin = torch.nn.Linear(D, D)
        expected = post.unsqueeze(-1) * lin(collapsed).unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), streams)
        torch.testing.assert_close(ours(streams.flatten(-2), lin), expected.flatten(-2), atol=1e-5, rtol=0)
        head_ref, head = DeepseekV4HyperHead(config), ManifoldHead(4, D)
        head.fn.normal_(std=0.3)
        head.base.normal_()
        head_ref.hc_fn.copy_(head.fn), head_ref.hc_base.copy_(head.base), head_ref.hc_scale.copy_(head.scale)
        torch.testing.assert_close(head(streams.flatten(-2)), head_ref(streams), atol=1e-5, rtol=0)
    assert comb.sum(-2).sub(1).abs().max() < 1e-5 and res.min() > 0 and pre.min() > MHC_EPS


def test_presets_count_parameters_and_train_with_four_streams():
    base = build()
    counts = {hc: sum(p.numel() for p in build(hc).parameters()) for hc in ("static", "dynamic", "mhc")}
    extra = {hc: c - sum(p.numel() for p in base.parameters()) for hc, c in counts.items()}
    # per sublayer (2 + 2 * 3 = 10 in 2 + 2 layers): static n(1+n) + n = 24; dynamic + LayerNorm 2D + D(1+n) + D + 2;
    # mHC (2+n) n (n D + 1) + 3; plus mHC's two heads n (n D + 1) + 1.
    assert extra == {"static": 240, "dynamic": 240 + 10 * (2 * D + D * 5 + D + 2), "mhc": 10 * (24 * 65 + 3) + 2 * (4 * 65 + 1)}
    model = build("mhc")
    src, tgt = batch()
    assert model.encoder[0].self_attn.hc is not None and model(src, tgt).shape == (2, 5, 20)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"residual_streams": 4}, "model.residual_streams=4 needs hyper-connections: set norm.hc"),
        ({"residual_streams": 0, "norm": NormConfig(hc="mhc")}, "model.residual_streams must be null or an integer >= 1"),
        ({"norm": NormConfig(hc="mhc", placement="post")}, "norm.hc=mhc cannot be used with norm.placement='post' (enc block 0)"),
        ({"norm": NormConfig(hc="static", gpas=True)}, "norm.hc=static cannot be used with norm.gpas=true (enc block 0)"),
    ],
)
def test_impossible_hyper_connection_configs_fail_at_config_time(cfg, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(src_vocab=20, tgt_vocab=20, **cfg)
    with pytest.raises(ValueError, match="unknown norm.hc 'mhcx'; valid: null"):
        NormConfig(hc="mhcx")
    assert HC_PLACEMENTS == ("pre", "sandwich", "lns", "res_post", "layerscale")
    assert ModelConfig(src_vocab=20, tgt_vocab=20, norm=NormConfig(hc="dynamic")).residual_streams == 4


def test_hc_gain_telemetry_records_each_stacks_composite_gain_over_real_tokens():
    from telemetry.hyper_connections import HyperConnectionStats

    src, tgt = batch()
    src_pad, tgt_pad = src.eq(0), torch.zeros_like(tgt, dtype=torch.bool)
    for hc, expected in (("static", 1.0), ("mhc", None)):
        model, stats = build(hc), {}
        handles = HyperConnectionStats(model, stats).hooks(src_pad, tgt_pad)
        with torch.no_grad():
            model(src, tgt)
        for h in handles:
            h.remove()
        assert sorted(stats) == ["hc/dec/bwd_gain", "hc/dec/fwd_gain", "hc/enc/bwd_gain", "hc/enc/fwd_gain"]
        if expected is not None:  # A = I at HC's init
            assert all(v.item() == expected for v in stats.values())
            continue
        # mHC: doubly stochastic up to Sinkhorn's residual; the value is the max over real tokens of the hand product
        x = model.streams(model.src_embed(src))
        mats = []
        for layer in model.encoder:
            for r in ("self_attn", "ffn"):
                mats.append(getattr(layer, r).hc.residual_matrix(x))
                x = getattr(layer, r)(x, *((None, src_pad) if r == "self_attn" else ()))
        fwd, _ = composite_gain(mats)
        assert stats["hc/enc/fwd_gain"].item() == pytest.approx(fwd[~src_pad].max().item(), abs=1e-6)
        assert all(abs(v.item() - 1) < 1e-3 for v in stats.values())
    model, stats = build(), {}
    assert HyperConnectionStats(model, stats).hooks(src_pad, tgt_pad) == []


SUBLAYERS = [f"encoder.{i}.{s}" for i in (0, 1) for s in ("self_attn", "ffn")]
SUBLAYERS += [f"decoder.{i}.{s}" for i in (0, 1) for s in ("self_attn", "cross_attn", "ffn")]


@pytest.mark.parametrize(("hc", "decayed", "merge_decayed"), [
    ("static", [], []),
    ("dynamic", ["alpha_fn", "beta_fn"], []),  # W_a and W_b, the same role (training/optim.py)
    ("mhc", ["fn"], ["enc_streams_merge.fn", "dec_streams_merge.fn"]),  # phi; base and scale are its biases, gains
])  # fmt: skip
def test_weight_decay_reaches_the_hc_projections_only(hc, decayed, merge_decayed):
    from training.optim import build_optimizer
    from training.presets import default_optim

    model = build(hc)
    decay, no_decay = build_optimizer(model, default_optim(lr=1e-3)).param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    in_decay = {id(p) for p in decay["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in in_decay and (".hc." in n or "streams_merge" in n)}
    assert names == {f"{s}.hc.{name}" for s in SUBLAYERS for name in decayed} | set(merge_decayed)
    hc_params = {n for n, _ in model.named_parameters() if ".hc." in n or "streams_merge" in n}
    kept = {"static": {"static_alpha", "static_beta"}, "mhc": {"base", "scale"},
            "dynamic": {"static_alpha", "static_beta", "alpha_scale", "beta_scale", "norm.weight", "norm.bias"}}[hc]  # fmt: skip
    assert {n.split(".hc.")[-1].split("streams_merge.")[-1] for n in hc_params - names} == kept


def test_static_mixing_gets_no_weight_decay_and_the_log_note_counts_hc_parameters():
    from training.optim import build_optimizer
    from training.presets import default_optim
    from training.run import hyper_connection_note

    model = build("dynamic")
    opt = build_optimizer(model, default_optim(lr=1e-3))
    no_decay = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    hc = model.encoder[0].ffn.hc
    assert id(hc.static_alpha) in no_decay and id(hc.alpha_fn) not in no_decay
    total = sum(p.numel() for p in model.parameters())
    plain = sum(p.numel() for p in build().parameters())
    assert hyper_connection_note(model) == (f" ({total:,}; {total - plain:,} of them hyper-connections, norm.hc=dynamic "
                                            f"over 4 streams; {plain:,} with one plain stream)")  # fmt: skip
    assert hyper_connection_note(build()) == ""


def test_sinkhorn_on_the_contiguous_layout_equals_the_plain_loop_bit_for_bit():
    m = torch.softmax(torch.randn(3, 5, 4, 4, generator=torch.Generator().manual_seed(0)), -1) + MHC_EPS
    plain = m / (m.sum(-2, keepdim=True) + MHC_EPS)  # the reference's loop, on the (..., n, n) layout
    for _ in range(SINKHORN_ITERS - 1):
        plain = plain / (plain.sum(-1, keepdim=True) + MHC_EPS)
        plain = plain / (plain.sum(-2, keepdim=True) + MHC_EPS)
    assert torch.equal(sinkhorn(m), plain)
