"""Telemetry: values equal hand computation, padding-free, side-effect-free, and the trends of
Xiong et al. 2020 measured with normlab's own telemetry at initialization."""

import copy
import math
import re
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from data.batching import Batch
from model import EncoderDecoder, ModelConfig, NormConfig
from model.telemetry import STATS, Telemetry, TelemetryConfig, first_nonfinite
from runlog.metric_names import (
    ACT_STAT_SITES,
    ATTENTION_NORM_SITES,
    BLOCK_SITES,
    FAMILY_STATS,
    SITE_GROUPS,
    STACK_SITES,
    WEIGHT_SITES,
    depth_profile,
    parse,
)
from tests.test_telemetry_baselines import doc_table
from training.optim import build_optimizer, build_scheduler
from training.schema import ScheduleConfig
from training.step import StepOptions, train_step

FULL = TelemetryConfig(every=1, updates=True, attn_entropy=True, attn_max_logit=True, logits=True)
EVERY_SITE_STATS = tuple(s for s in STATS if s not in ACT_STAT_SITES)  # the stats every act site has


def make(placement="pre", kind="layernorm", n=2, d=32, seed=0, dropout=0.0, **attention_norms) -> EncoderDecoder:
    torch.manual_seed(seed)
    norm = NormConfig(kind=kind, placement=placement, **attention_norms)
    cfg = ModelConfig(src_vocab=30, tgt_vocab=40, d_model=d, n_heads=4, d_ff=2 * d, n_enc_layers=n, n_dec_layers=n,
                      dropout=dropout, norm=norm)  # fmt: skip
    return EncoderDecoder(cfg)


def batch(seed=0, pad=True):
    g = torch.Generator().manual_seed(seed)
    src, tgt_in, tgt_out = (torch.randint(4, 30, (6, 9), generator=g) for _ in range(3))
    if pad:  # right padding of different lengths
        for row, n in enumerate([0, 2, 4, 1, 3, 5]):
            if n:
                src[row, -n:] = 0
                tgt_in[row, -n:] = 0
                tgt_out[row, -n:] = 0
    return src, tgt_in, tgt_out


def watch_backward(tele: Telemetry, model, src, tgt_in, tgt_out) -> None:
    """One watched forward pass, its output logits and its backward pass, as a training step records them."""
    with tele.watch(src.eq(0), tgt_out.eq(0)):
        logits = model(src, tgt_in)
    tele.record_logits(logits, tgt_out.eq(0))
    F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=0).backward()
    tele.record_grad_norms()


def record(model, src, tgt_in, tgt_out, cfg=FULL) -> dict[str, float]:
    tele = Telemetry(model, cfg)
    watch_backward(tele, model, src, tgt_in, tgt_out)
    return tele.collect()


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


@pytest.mark.parametrize("placement", ["post", "pre", "sandwich", "deepnorm"])
def test_outputs_are_bit_identical_with_telemetry_on_and_off(placement):
    model = make(placement).eval()
    src, tgt_in, tgt_out = batch()
    plain = model(src, tgt_in)
    with Telemetry(model, FULL).watch(src.eq(0), tgt_out.eq(0)):
        watched = model(src, tgt_in)
    assert torch.equal(plain, watched)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # nothing left behind


def train_steps(model: EncoderDecoder, every: int, steps: int = 4) -> tuple[list[float], list[dict], list, torch.Tensor]:
    """``steps`` training steps from seed 0 as train.py runs them (``train_step``), telemetry
    recording when due; returns the losses, the statistics per step, the weights, the RNG state."""
    torch.manual_seed(0)
    src, tgt_in, tgt_out = batch()
    b = Batch(src, tgt_in, tgt_out, list(range(len(src))), int(tgt_out.ne(0).sum()))
    opt = build_optimizer(model, 1e-3, (0.9, 0.98), 0.01, 1e-9)
    sched = build_scheduler(opt, 1e-3, ScheduleConfig(0, "constant"), steps)
    tele = Telemetry(model, TelemetryConfig(every=every, attn_entropy=True, attn_max_logit=True, logits=True))
    losses, stats = [], []
    for step in range(1, steps + 1):
        options = StepOptions(world=1, label_smoothing=0.1, grad_clip=1.0, autocast=nullcontext(),
                              step_tokens=b.n_tgt_tokens, record=tele.due(step, steps))  # fmt: skip
        loss = train_step(model, [b], opt, sched, tele, options).loss
        losses.append(loss.item())
        stats.append(tele.collect())
    return losses, stats, [p.detach().clone() for p in model.parameters()], torch.get_rng_state()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_training_is_bit_identical_with_telemetry_on_and_off_with_dropout(compiled):
    model = make(n=1, dropout=0.1)
    init = copy.deepcopy(model.state_dict())
    if compiled:
        model.compile_layers()

    def run(every: int, stance: str = "default"):  # one model, so its layers compile once
        model.load_state_dict(init)
        with torch.compiler.set_stance(stance):
            return train_steps(model, every)

    off_losses, _, off_weights, off_rng = run(0)
    on_losses, on_stats, on_weights, on_rng = run(2)  # records steps 1, 2 and 4
    assert [bool(s) for s in on_stats] == [True, True, False, True]
    assert {parse(k).family for k in on_stats[0]} >= {"weight", "scale", "optim"}  # parameter and AdamW telemetry ran too
    assert "update/enc.0/adam_rms" in on_stats[0] and "update/enc.0/ratio" not in on_stats[0]
    assert on_losses == off_losses
    assert all(torch.equal(a, b) for a, b in zip(on_weights, off_weights, strict=True))
    assert torch.equal(on_rng, off_rng)
    # Compiled layers draw eager's dropout masks: the same losses and generator state as an eager
    # run, and telemetry's extra eager pass sees the masks of the training pass it describes.
    eager_losses, eager_stats, _, eager_rng = run(2, "force_eager")
    assert on_losses == pytest.approx(eager_losses, rel=1e-5)
    assert torch.equal(on_rng, eager_rng)
    assert on_stats[0].keys() == eager_stats[0].keys()
    for key, value in eager_stats[0].items():
        # adam_rms reads the training pass's gradients, where a key bias's is rounding noise (its exact
        # gradient is 0) that compiled and eager kernels round differently: at step 1 each such coordinate
        # adds some g^2 / eps^2 in [0, 1): the 32 (64) of an encoder (decoder) block's 8544 (12832)
        # coordinates move its adam_rms by up to 0.19 % (0.25 %). The same coordinates sit near AdamW's eps,
        # so the two kernels put a few of them on either side of it: below_eps moved by 0.18 % on one machine.
        rel = 3e-3 if parse(key).stat in ("adam_rms", "below_eps") else 1e-5
        assert on_stats[0][key] == pytest.approx(value, rel=rel, abs=1e-6), key


def test_attention_entropy_of_uniform_attention_is_log_of_key_count():
    model = make().eval()
    for residual in [layer.self_attn for layer in model.encoder] + [
        r for layer in model.decoder for r in (layer.self_attn, layer.cross_attn)
    ]:
        torch.nn.init.zeros_(residual.branch.q_proj.weight)  # all scores equal: uniform attention
        torch.nn.init.zeros_(residual.branch.q_proj.bias)
    src, tgt_in, tgt_out = batch(pad=False)  # 9 keys everywhere
    stats = record(model, src, tgt_in, tgt_out)
    assert stats["attn/enc.0.self_attn/entropy"] == pytest.approx(math.log(9), rel=1e-5)
    assert stats["attn/dec.1.cross_attn/entropy"] == pytest.approx(math.log(9), rel=1e-5)
    # Causal: query t attends uniformly over t + 1 keys.
    assert stats["attn/dec.0.self_attn/entropy"] == pytest.approx(sum(math.log(t + 1) for t in range(9)) / 9, rel=1e-5)


def test_update_ratio_equals_hand_computation():
    model = make()
    src, tgt_in, tgt_out = batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tele = Telemetry(model, FULL)
    F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=0).backward()
    before = [p.detach().clone() for p in model.encoder[0].parameters()]
    grads = [p.grad.clone() for p in model.encoder[0].parameters()]
    with tele.watch_update():
        opt.step()
    expected = 0.1 * torch.cat([g.flatten() for g in grads]).norm() / torch.cat([b.flatten() for b in before]).norm()
    assert tele.collect()["update/enc.0/ratio"] == pytest.approx(expected.item(), rel=1e-4)


def test_records_at_init_every_n_steps_and_at_the_end():
    tele = Telemetry(make(), TelemetryConfig(every=50))
    assert [s for s in range(1, 121) if tele.due(s, 120)] == [1, 50, 100, 120]
    assert not any(Telemetry(make(), TelemetryConfig(every=0)).due(s, 120) for s in range(1, 121))


def test_unknown_site_or_stat_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match="unknown telemetry.sites \\['outt'\\]; valid sites: embed, in, branch, norm, out, final_norm"
    ):
        TelemetryConfig(sites=("outt",))
    with pytest.raises(
        ValueError, match="unknown telemetry.stats \\['kurt'\\]; valid stats: rms, mean, maxabs, crest, kurtosis, token_cos, sat"
    ):
        TelemetryConfig(stats=("kurt",))


def test_first_nonfinite_names_the_first_site_in_forward_order():
    model = make("post").eval()
    with torch.no_grad():
        model.encoder[1].ffn.branch.linear2.bias.fill_(float("inf"))
    src, tgt_in, tgt_out = batch()
    tele = Telemetry(model, TelemetryConfig(every=1))
    with tele.watch(src.eq(0), tgt_out.eq(0)):
        model(src, tgt_in)
    assert first_nonfinite(tele.collect()) == "act/enc.1.ffn/rms"


def test_depth_profile_orders_encoder_then_decoder():
    stats = {
        "act/enc.0.out/rms": 1.0,
        "act/enc.1.out/rms": 2.0,
        "act/dec.0.out/rms": 3.0,
        "act/enc.embed/rms": 9.0,
        "grad/enc.0/norm": 5.0,
    }
    assert depth_profile(stats) == {"out": [(0, 1.0), (1, 2.0), (2, 3.0)]}


def mean_over_seeds(placement: str, key: str, n: int = 6) -> list[float]:
    """``key`` formatted with {s}.{i} for each block of a 6+6 model at init, averaged over seeds."""
    runs = []
    for seed in range(3):
        model = make(placement, n=n, d=64, seed=seed)
        cfg = TelemetryConfig(every=1, sites=("out",), stats=("rms",))
        runs.append(record(model, *batch(seed, pad=True), cfg=cfg))
    return [sum(r[key.format(i=i)] for r in runs) / len(runs) for i in range(n)]


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


def test_xiong_fig3_post_ln_gradients_grow_toward_the_output_pre_ln_do_not():
    post = mean_over_seeds("post", "grad/dec.{i}/norm")
    pre = mean_over_seeds("pre", "grad/dec.{i}/norm")
    assert post[-1] / post[0] > 2.0, post
    assert pre[-1] / pre[0] < 1.2, pre
    assert post[-1] / post[0] > 2 * pre[-1] / pre[0]


def pooled_stats(x: torch.Tensor, pad: torch.Tensor) -> dict[str, float]:
    """The four stats of a per-head tensor x (B, H, L, K) by hand, over the positions where pad (B, L) is False."""
    real = x.transpose(1, 2)[~pad].double()  # (N, H, K)
    rms, maxabs = real.pow(2).mean().sqrt().item(), real.abs().max().item()
    return {"rms": rms, "mean": real.mean().item(), "maxabs": maxabs, "crest": maxabs / rms}


def qkv_model_and_batch():
    """A pre-LN model with RMSNorm on q and k and LayerNorm on v (weights moved off their init), and
    a batch whose source and target are padded differently, so a statistic over the wrong side's
    padding comes out different."""
    model = make(qk="rmsnorm", v="layernorm").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(f"{site}." in name for site in ATTENTION_NORM_SITES):
                p.add_(0.3 * torch.randn_like(p))
    src, tgt_in, tgt_out = batch(pad=False)
    for row, (n_src, n_tgt) in enumerate([(0, 5), (2, 0), (4, 1), (1, 3), (3, 2), (5, 4)]):
        if n_src:
            src[row, -n_src:] = 0
        if n_tgt:
            tgt_in[row, -n_tgt:] = 0
            tgt_out[row, -n_tgt:] = 0
    return model, src, tgt_in, tgt_out


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


def doc_pattern(pattern: str) -> re.Pattern:
    """A name pattern of the docs table (``act/{s}.{i}.in/{stat}``) as a regex."""
    fields = {"s": "enc|dec", "i": r"\d+", "r": "self_attn|cross_attn|ffn", "slot": "norm_in|norm_branch|norm_out",
              "a": "self_attn|cross_attn", "h": "q_norm|k_norm|v_norm", "m": "|".join(map(re.escape, WEIGHT_SITES)),
              "stat": "|".join(stat for stats in FAMILY_STATS.values() for stat in stats)}  # fmt: skip
    return re.compile(re.sub(r"\\{(\w+)\\}", lambda m: f"({fields[m.group(1)]})", re.escape(pattern.strip("`"))))


def record_step(model: EncoderDecoder, cfg: TelemetryConfig) -> dict[str, float]:
    """Everything ``cfg`` records on one AdamW step of ``model`` over ``batch()``."""
    tele = Telemetry(model, cfg)
    watch_backward(tele, model, *batch())
    tele.record_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tele.watch_update():
        opt.step()
    tele.record_adam(opt)
    model.zero_grad()
    return tele.collect()


SWITCHES = ("grads", "updates", "attn_entropy", "attn_max_logit", "logits", "weights", "scales", "adam")


def test_docs_metric_names_table_is_what_each_group_records():
    rows = [[c.strip("`") for c in row] for row in doc_table("recorded by")]
    assert len(rows) == 21
    # Between them, every kind of site: q/k/v norms, residual gates, an l2 QK-norm temperature, closing norms.
    models = [make("sandwich", qk="rmsnorm", v="layernorm"), make("layerscale", qk="l2"), make("post")]
    for group in dict.fromkeys(row[0] for row in rows):
        flags = {flag: group == flag for flag in SWITCHES}
        cfg = TelemetryConfig(every=1, sites=(group,) if group in SITE_GROUPS else (), **flags)
        stats = {key: value for model in models for key, value in record_step(model, cfg).items()}
        patterns = [(doc_pattern(pattern), example) for g, pattern, example, _ in rows if g == group]
        for regex, example in patterns:
            assert example in stats and regex.fullmatch(example) and parse(example), (group, example)
        for key in stats:  # every name the group records has its row, and parses back
            assert any(regex.fullmatch(key) for regex, _ in patterns) and parse(key).name == key, (group, key)


def test_docs_say_for_every_act_site_whether_it_is_read_before_or_after_a_norm():
    rows = doc_table("act site")
    patterns = [doc_pattern(name) for row in rows for name in re.findall(r"`([^`]+)`", row[0])]
    for site in (*STACK_SITES, *BLOCK_SITES):
        assert sum(bool(p.fullmatch(site)) for p in patterns) == 1, site
    assert all(row[1] and row[2] for row in rows)  # before / after, and the gain


# Issue 13: the variants' norm sites (placement, its norm keys). rezero and tfixup have no norm site.
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
