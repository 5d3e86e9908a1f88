"""telemetry/activations.py: every site is named, watched and equal to hand computation over real
positions only (per-head q/k/v norms over each side's own positions), and Xiong et al. 2020's Lemma 2
trends measured with normlab's own telemetry at initialization."""

import re

import pytest
import torch
import torch.nn.functional as F

from runlog.metric_names import ATTENTION_NORM_SITES, BLOCK_SITES, STACK_SITES, parse
from telemetry.config import TelemetryConfig
from tests.helpers.telemetry import (
    EVERY_SITE_STATS,
    batch,
    doc_pattern,
    doc_table,
    make,
    mean_over_seeds,
    qkv_model_and_batch,
    record,
)


def test_hook_statistics_equal_hand_computation():
    model = make().eval()
    src, tgt_in, tgt_out = batch()
    stats = record(model, src, tgt_in, tgt_out)
    keep = ~src.eq(0)
    with torch.no_grad():
        x = model.src_embed(src)
        x = model.encoder[0](x, src.eq(0))
        attn_out = model.encoder[1].self_attn.branch(model.encoder[1].self_attn.norm_in(x), None, src.eq(0))
    real = x[keep]  # (n, D): non-padding positions only
    assert stats["act/enc.0.out/rms"] == pytest.approx(real.pow(2).mean().sqrt().item(), rel=1e-5)
    assert stats["act/enc.0.out/mean"] == pytest.approx(real.mean().item(), rel=1e-4, abs=1e-7)
    assert stats["act/enc.0.out/maxabs"] == pytest.approx(real.abs().max().item(), rel=1e-6)
    assert stats["act/enc.0.out/crest"] == pytest.approx((real.abs().max() / real.pow(2).mean().sqrt()).item(), rel=1e-5)
    assert stats["act/enc.1.in/rms"] == stats["act/enc.0.out/rms"]
    assert stats["act/enc.1.self_attn/rms"] == pytest.approx(attn_out[keep].pow(2).mean().sqrt().item(), rel=1e-5)
    grads = [p.grad.norm() for p in model.decoder[1].parameters()]
    assert stats["grad/dec.1/norm"] == pytest.approx(torch.stack(grads).norm().item(), rel=1e-5)


def test_every_site_is_named_and_norm_outputs_are_normalized():
    stats = record(make("sandwich"), *batch())
    for stat in EVERY_SITE_STATS:
        for site in ("enc.embed", "enc.0.in", "enc.0.self_attn", "enc.0.self_attn.norm_in", "enc.0.self_attn.norm_branch",
                     "enc.0.ffn", "enc.1.out", "enc.final_norm", "dec.embed", "dec.1.cross_attn", "dec.1.cross_attn.norm_branch",
                     "dec.final_norm"):  # fmt: skip
            assert f"act/{site}/{stat}" in stats
    # A LayerNorm with gamma=1, beta=0 outputs rows of zero mean and unit RMS.
    assert stats["act/dec.0.ffn.norm_in/rms"] == pytest.approx(1.0, abs=1e-4)
    assert stats["act/dec.0.ffn.norm_in/mean"] == pytest.approx(0.0, abs=1e-5)
    assert "attn/dec.1.cross_attn/entropy" in stats and "grad/enc.0/norm" in stats


@pytest.mark.parametrize("kind", ["layernorm", "dyt"])  # DyT: saturation too
def test_padding_changes_no_statistic(kind):
    model = make(kind=kind).eval()
    src, tgt_in, tgt_out = batch()
    base = record(model, src, tgt_in, tgt_out)
    assert {"kurtosis", "token_cos", "saturation" if kind == "dyt" else "rms"} <= {parse(k).stat for k in base}
    model.zero_grad()
    pad = lambda t: torch.cat([t, torch.zeros(t.shape[0], 4, dtype=t.dtype)], dim=1)  # noqa: E731
    padded = record(model, pad(src), pad(tgt_in), pad(tgt_out))
    assert base.keys() == padded.keys()
    for key, value in base.items():
        assert padded[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def pooled_stats(x: torch.Tensor, pad: torch.Tensor) -> dict[str, float]:
    """The four stats of a per-head tensor x (B, H, L, K) by hand, over the positions where pad (B, L) is False."""
    real = x.transpose(1, 2)[~pad].double()  # (N, H, K)
    rms, maxabs = real.pow(2).mean().sqrt().item(), real.abs().max().item()
    return {"rms": rms, "mean": real.mean().item(), "maxabs": maxabs, "crest": maxabs / rms}


def test_attention_norm_sites_equal_hand_computation_over_each_sides_real_positions():
    model, src, tgt_in, tgt_out = qkv_model_and_batch()
    stats = record(model, src, tgt_in, tgt_out)
    src_pad, tgt_pad = src.eq(0), tgt_out.eq(0)

    def heads(t: torch.Tensor) -> torch.Tensor:  # (B, L, D) -> (B, H, L, K)
        return t.view(t.shape[0], t.shape[1], 4, -1).transpose(1, 2)

    def rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
        return norm.weight * x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()

    with torch.no_grad():
        memory = model.encode(src, src_pad)
        enc_attn = model.encoder[0].self_attn
        enc_q = rms_norm(heads(enc_attn.branch.q_proj(enc_attn.norm_in(model.src_embed(src)))), enc_attn.branch.q_norm)
        dec_attn = model.decoder[0].self_attn
        dec_k = rms_norm(heads(dec_attn.branch.k_proj(dec_attn.norm_in(model.tgt_embed(tgt_in)))), dec_attn.branch.k_norm)
        cross = model.decoder[1].cross_attn.branch
        cross_k = rms_norm(heads(cross.k_proj(memory)), cross.k_norm)
        K = cross.v_norm.weight.shape[0]
        cross_v = F.layer_norm(heads(cross.v_proj(memory)), (K,), cross.v_norm.weight, cross.v_norm.bias, eps=1e-5)
    expected = {
        "enc.0.self_attn.q_norm": pooled_stats(enc_q, src_pad),
        "dec.0.self_attn.k_norm": pooled_stats(dec_k, tgt_pad),  # decoder self-attention: keys are target positions
        "dec.1.cross_attn.k_norm": pooled_stats(cross_k, src_pad),  # cross-attention: keys are source positions
        "dec.1.cross_attn.v_norm": pooled_stats(cross_v, src_pad),
    }
    for site, want in expected.items():
        for stat, value in want.items():
            assert stats[f"act/{site}/{stat}"] == pytest.approx(value, rel=1e-5, abs=1e-6), (site, stat)
    assert pooled_stats(cross_k, tgt_pad)["rms"] != pytest.approx(expected["dec.1.cross_attn.k_norm"]["rms"], rel=1e-5)


def test_attention_norm_sites_are_named_parse_back_and_ignore_padding():
    model, src, tgt_in, tgt_out = qkv_model_and_batch()
    stats = record(model, src, tgt_in, tgt_out)
    attentions = [("enc", i, "self_attn") for i in range(2)]
    attentions += [("dec", i, a) for i in range(2) for a in ("self_attn", "cross_attn")]
    sites = {f"act/{s}.{i}.{a}.{h}/{stat}" for s, i, a in attentions for h in ATTENTION_NORM_SITES for stat in EVERY_SITE_STATS}
    assert sites <= stats.keys()
    assert all(parse(k) is not None and parse(k).name == k for k in stats)
    # More padding on the source than on the target changes none of them.
    model.zero_grad()
    pad = lambda t, n: torch.cat([t, torch.zeros(t.shape[0], n, dtype=t.dtype)], dim=1)  # noqa: E731
    padded = record(model, pad(src, 4), pad(tgt_in, 2), pad(tgt_out, 2))
    for key in sites:
        assert padded[key] == pytest.approx(stats[key], rel=1e-4, abs=1e-6), key
    # Off (nn.Identity) or outside the configured site groups: not recorded.
    assert not any(".q_norm/" in k for k in record(make(), *batch()))
    assert not any(".q_norm/" in k for k in record(model, src, tgt_in, tgt_out, TelemetryConfig(every=1, sites=("branch",))))


def test_docs_say_for_every_act_site_whether_it_is_read_before_or_after_a_norm():
    rows = doc_table("act site")
    patterns = [doc_pattern(name) for row in rows for name in re.findall(r"`([^`]+)`", row[0])]
    for site in (*STACK_SITES, *BLOCK_SITES):
        assert sum(bool(p.fullmatch(site)) for p in patterns) == 1, site
    assert all(row[1] and row[2] for row in rows)  # before / after, and the gain


# The 2023-2026 variants' norm sites (placement, its norm keys). rezero and tfixup have no norm site.
VARIANT_SITES = {
    "lns": {},
    "mix_ln": {"mix_ln_alpha": 0.5},  # 1 of 2 blocks per stack post-LN
    "hybrid": {"kind": "rmsnorm", "qk": "rmsnorm", "v": "rmsnorm"},
    "hybrid_star": {"kind": "rmsnorm", "qk": "rmsnorm", "v": "rmsnorm"},
    "res_post": {},
    "admin": {},
    "keel": {},
    "b2t": {},
    "layerscale": {},
    "pre": {"qk": "l2"},
}


@pytest.mark.parametrize(("placement", "keys"), VARIANT_SITES.items())
def test_every_variant_norm_site_is_watched_and_equals_hand_computation(placement, keys):
    """Every filled residual norm slot is recorded under its name with the RMS of its formula applied to
    the slot's input at init (weights 1, biases 0), over real positions; an l2 q/k norm has RMS 1/sqrt(K)."""
    model = make(placement, **{"kind": "layernorm", **keys}).eval()
    src, tgt_in, tgt_out = batch()
    slots = {
        name: m
        for name, m in model.named_modules()
        if name.split(".")[-1].startswith("norm_") and not isinstance(m, torch.nn.Identity)
    }
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_pre_hook(lambda m, a, name=name: seen.__setitem__(name, a[0].detach())) for name, m in slots.items()
    ]
    stats = record(model, src, tgt_in, tgt_out)
    for h in hooks:
        h.remove()
    assert slots, "a variant with norms watches some"
    for name in slots:
        stack, i, r, slot = name.split(".")  # e.g. encoder.0.ffn.norm_in
        x = seen[name]
        if keys.get("kind") == "rmsnorm":
            y = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
        else:
            y = F.layer_norm(x, x.shape[-1:], eps=1e-5)
        keep = ~(src if stack == "encoder" else tgt_out).eq(0)
        metric = f"act/{stack[:3]}.{i}.{r}.{slot}/rms"
        assert stats[metric] == pytest.approx(y[keep].pow(2).mean().sqrt().item(), rel=1e-5), metric
    if keys.get("qk") == "l2":  # unit vectors of K = 8 features: RMS over elements exactly 1/sqrt(8)
        for a in ("enc.0.self_attn", "dec.1.self_attn", "dec.1.cross_attn"):
            assert stats[f"act/{a}.q_norm/rms"] == pytest.approx(8**-0.5, rel=1e-5)
            assert stats[f"act/{a}.k_norm/rms"] == pytest.approx(8**-0.5, rel=1e-5)
    if placement.startswith("hybrid"):
        assert {"act/enc.1.self_attn.q_norm/rms", "act/dec.1.cross_attn.v_norm/rms"} <= stats.keys()
        assert "act/enc.1.self_attn.norm_in/rms" not in stats  # HybridNorm: no norm on the attention input


@pytest.mark.parametrize("placement", ["post", "deepnorm"])
def test_pre_norm_site_is_the_sum_entering_the_closing_norm(placement):
    """``{r}.norm_out.in`` is alpha * x + F(x) before the closing LayerNorm (alpha 1 for post-LN, DeepNet's for
    deepnorm), over real positions; ``out``, that LayerNorm's output at init (gain 1, bias 0), has RMS 1."""
    model = make(placement).eval()
    src, tgt_in, tgt_out = batch()
    stats = record(model, src, tgt_in, tgt_out)
    keep = ~src.eq(0)
    block = model.encoder[1]
    with torch.no_grad():
        x = model.encoder[0](model.src_embed(src), src.eq(0))
        attn_sum = block.self_attn.alpha * x + block.self_attn.branch(x, None, src.eq(0))
        h = block.self_attn.norm_out(attn_sum)
        ffn_sum = block.ffn.alpha * h + block.ffn.branch(h)
    assert block.ffn.alpha == (1.0 if placement == "post" else pytest.approx(0.81 * 32 ** (1 / 16)))  # N = M = 2
    for site, total in (("self_attn", attn_sum), ("ffn", ffn_sum)):
        want = total[keep].pow(2).mean().sqrt().item()
        assert stats[f"act/enc.1.{site}.norm_out.in/rms"] == pytest.approx(want, rel=1e-5)
        assert abs(want - 1) > 0.03  # not a LayerNorm output (post: 1.26 and 1.28; deepnorm: 1.031 and 1.12)
    assert stats["act/enc.1.ffn.norm_out.in/maxabs"] == pytest.approx(ffn_sum[keep].abs().max().item(), rel=1e-6)
    assert stats["act/enc.1.out/rms"] == pytest.approx(1.0, abs=1e-4)
    assert stats["act/enc.1.ffn.norm_out/rms"] == stats["act/enc.1.out/rms"]  # the closing norm's output is the block's


@pytest.mark.parametrize("placement", ["post", "pre", "admin", "keel", "b2t", "mix_ln", "res_post", "hybrid"])
def test_pre_norm_site_is_recorded_exactly_where_norm_out_is_filled(placement):
    keys = {"kind": "rmsnorm", "qk": "rmsnorm", "v": "rmsnorm"} if placement == "hybrid" else {"mix_ln_alpha": 0.5}
    model = make(placement, **keys)
    filled = {
        f"{name.split('.')[0][:3]}.{'.'.join(name.split('.')[1:-1])}"  # encoder.0.ffn.norm_out -> enc.0.ffn
        for name, m in model.named_modules()
        if name.endswith("norm_out") and not isinstance(m, torch.nn.Identity)
    }
    stats = record(model, *batch())
    seen = {k.split("/")[1].removesuffix(".norm_out.in") for k in stats if k.endswith(".norm_out.in/rms")}
    assert seen == filled
    expected = {"post": 10, "admin": 10, "keel": 10, "b2t": 10, "mix_ln": 5}.get(placement, 0)  # 2 + 3 residuals per block
    assert len(seen) == expected
    out_only = record(model, *batch(), cfg=TelemetryConfig(every=1, sites=("out",), stats=("rms",)))
    assert {k for k in out_only if "norm_out.in" in k} == {f"act/{r}.norm_out.in/rms" for r in seen}  # group out
    assert not any("norm_out.in" in k for k in record(model, *batch(), cfg=TelemetryConfig(every=1, sites=("norm",))))


def test_xiong_lemma2_pre_ln_stream_grows_with_depth_post_ln_stays_flat():
    for stack in ("enc", "dec"):
        pre = mean_over_seeds("pre", f"act/{stack}.{{i}}.out/rms")
        assert all(b > a for a, b in zip(pre, pre[1:], strict=False)), pre  # grows with every block
        assert pre[-1] / pre[0] > 1.5
        post = mean_over_seeds("post", f"act/{stack}.{{i}}.out/rms")
        assert all(abs(r - 1.0) < 1e-3 for r in post), post  # each block ends in LN(gamma=1, beta=0)


def test_xiong_lemma2_post_ln_stream_before_its_layernorm_is_flat_but_not_unit():
    """Lemma 2 is about the LayerNorm input x + F(x): in post-LN its scale does not grow with depth either, but it is
    not the LayerNorm output's 1 (at this init about 1.2: x of RMS 1 plus a ReLU FFN's output)."""
    for stack in ("enc", "dec"):
        post = mean_over_seeds("post", f"act/{stack}.{{i}}.ffn.norm_out.in/rms")
        assert all(1.1 < r < 1.45 for r in post), post
        assert 0.85 < post[-1] / post[0] < 1.15, post
