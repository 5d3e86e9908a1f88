"""QK-Clip (``optim.qk_clip``, training/qk_clip.py): the per-head max logit against a brute-force computation (padding,
the causal mask, cross-attention), the exact scaling of one head's W_q / W_k rows and biases, every attention kind
clipped to tau on the step's own batch, its telemetry, its refusals, its config errors, and no change when off."""

import json
import math
import sys
from contextlib import nullcontext

import pytest
import torch

import train as train_module
from data.batching import Batch
from model.transformer import EncoderDecoder
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.config import ROOT, make_cfg
from tests.helpers.distributed import DEFAULTS, assert_trains_as_one_process, run
from tests.helpers.telemetry import batch, make
from training.optim import build_optimizer, build_scheduler
from training.presets import default_optim
from training.qk_clip import COMPILE_REFUSED, QKClip, attentions, build_qk_clip
from training.qk_clip_config import QKClipConfig
from training.schema import ScheduleConfig, validate
from training.step import StepOptions, train_step

SITES = [("dec", 0, "cross_attn"), ("dec", 0, "self_attn"), ("dec", 1, "cross_attn"), ("dec", 1, "self_attn")]
SITES += [("enc", 0, "self_attn"), ("enc", 1, "self_attn")]  # sorted
OFF = dict(sites=(), grads=False, weights=False, scales=False, attn_max_logit=False, logits=False, adam=False)
ONLY_QK_CLIP = TelemetryConfig(every=1, **OFF, batch_stats=False)  # records nothing but QK-Clip's optim/ stats
K = 8  # head size of make(): d_model 32, 4 heads
H = 4


def inputs_of(model: EncoderDecoder, src: torch.Tensor, tgt_in: torch.Tensor) -> dict[str, tuple]:
    """Each attention's call (x, memory, key_pad_mask) in one forward pass, by ``{stack}.{i}.{attention}``."""
    calls: dict[str, tuple] = {}
    handles = [
        attn.register_forward_pre_hook(lambda m, args, where=where: calls.__setitem__(where, args))
        for where, attn in attentions(model)
    ]
    with torch.no_grad():
        model(src, tgt_in)
    for h in handles:
        h.remove()
    return calls


def brute_force_max(model: EncoderDecoder, src: torch.Tensor, tgt_in: torch.Tensor) -> dict[str, torch.Tensor]:
    """(H,) per attention: max over real queries i and the keys j they may see of q_i^h . k_j^h / sqrt(K), with q and
    k projected by hand from the attention's inputs, masks built loop by loop."""
    out = {}
    for where, attn in attentions(model):
        x, memory, key_pad = inputs_of(model, src, tgt_in)[where][:3]
        kv = x if memory is None else memory
        q = (x @ attn.q_proj.weight.T + attn.q_proj.bias).detach()  # (B, T, D)
        k = (kv @ attn.k_proj.weight.T + attn.k_proj.bias).detach()  # (B, S, D)
        query_pad = (src if where.startswith("enc.") else tgt_in).eq(0)
        best = torch.full((H,), -math.inf)
        for b in range(q.shape[0]):
            for i in range(q.shape[1]):
                if query_pad[b, i]:
                    continue
                for j in range(k.shape[1]):
                    if (key_pad is not None and key_pad[b, j]) or (attn.causal and j > i):
                        continue
                    for h in range(H):
                        s = q[b, i, h * K : (h + 1) * K] @ k[b, j, h * K : (h + 1) * K] / math.sqrt(K)
                        best[h] = max(best[h], s)
        out[where] = best
    return out


def watched_max(model: EncoderDecoder, clip: QKClip, src: torch.Tensor, tgt_in: torch.Tensor) -> dict[str, torch.Tensor]:
    with clip.watch(src.eq(0), tgt_in.eq(0)), torch.no_grad():
        model(src, tgt_in)
    out = {where: m for (where, _), m in zip(clip.attentions, clip.max_logits, strict=True)}
    clip.max_logits = [None] * len(clip.attentions)
    return out


def test_per_head_max_logit_is_the_brute_force_one_over_real_queries_and_visible_keys():
    model = make(n=1).eval()
    src, tgt_in, _ = batch()  # right padding of different lengths in src and tgt
    with torch.no_grad():  # larger logits, so that a masked key or query would show
        for _, attn in attentions(model):
            attn.q_proj.weight.mul_(4)
    seen = watched_max(model, QKClip(model, QKClipConfig(tau=1.0)), src, tgt_in)
    expected = brute_force_max(model, src, tgt_in)
    assert sorted(seen) == ["dec.0.cross_attn", "dec.0.self_attn", "enc.0.self_attn"]
    for where in seen:
        assert seen[where] == pytest.approx(expected[where], rel=1e-5, abs=1e-6), where


def test_one_head_at_twice_tau_has_its_rows_scaled_exactly_and_lands_on_tau():
    model = make(n=1).eval()
    src, tgt_in, _ = batch()
    attn = model.decoder[0].cross_attn.branch  # q from the decoder, k from the encoder's memory
    with torch.no_grad():
        attn.q_proj.weight[: 2 * K].mul_(20)  # heads 0 and 1 far above every other head of the model
    before = brute_force_max(model, src, tgt_in)
    tau = before["dec.0.cross_attn"][0].item() / 2  # head 0 at exactly 2 tau
    assert before["dec.0.cross_attn"][1] > tau  # head 1 clipped too, by its own factor
    assert all(
        m[h] <= tau
        for where, m in before.items()
        for h in range(H)
        if (where, h) not in {("dec.0.cross_attn", 0), ("dec.0.cross_attn", 1)}
    )
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    alpha = 0.3
    clip = QKClip(model, QKClipConfig(tau=tau, alpha=alpha))
    with clip.watch(src.eq(0), tgt_in.eq(0)), torch.no_grad():
        model(src, tgt_in)
    gamma = clip.clip()
    g1 = tau / before["dec.0.cross_attn"][1].item()
    prefix = "decoder.0.cross_attn.branch."
    q, k = weights[prefix + "q_proj.weight"], weights[prefix + "k_proj.weight"]
    qb, kb = weights[prefix + "q_proj.bias"], weights[prefix + "k_proj.bias"]
    now = dict(model.named_parameters())
    for h, g in ((0, 0.5), (1, g1)):
        rows = slice(h * K, (h + 1) * K)
        assert torch.allclose(now[prefix + "q_proj.weight"][rows], q[rows] * g**alpha, rtol=1e-6)
        assert torch.allclose(now[prefix + "k_proj.weight"][rows], k[rows] * g ** (1 - alpha), rtol=1e-6)
        assert torch.allclose(now[prefix + "q_proj.bias"][rows], qb[rows] * g**alpha, rtol=1e-6)
        assert torch.allclose(now[prefix + "k_proj.bias"][rows], kb[rows] * g ** (1 - alpha), rtol=1e-6)
    untouched = [n for n in weights if not n.startswith((prefix + "q_proj", prefix + "k_proj"))]
    assert all(torch.equal(now[n], weights[n]) for n in untouched)
    for proj in ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias"):  # heads 2 and 3 below tau
        assert torch.equal(now[prefix + proj][2 * K :], weights[prefix + proj][2 * K :])
    assert gamma.shape == (3, H) and (gamma < 1).sum() == 2 and gamma.min().item() == pytest.approx(0.5)
    after = brute_force_max(model, src, tgt_in)
    assert after["dec.0.cross_attn"][:2] == pytest.approx([tau, tau], rel=1e-5)
    assert torch.equal(after["dec.0.cross_attn"][2:], before["dec.0.cross_attn"][2:])
    assert all(torch.equal(after[w], before[w]) for w in after if w != "dec.0.cross_attn")


def step_options(micro: list[Batch], clip: QKClip | None, record: bool = False) -> StepOptions:
    tokens = sum(b.n_tgt_tokens for b in micro)
    return StepOptions(1, 0.1, 1.0, nullcontext(), step_tokens=tokens, record=record, qk_clip=clip)


def micro_batches() -> list[Batch]:
    """The padded test batch as two micro-batches of 3 rows."""
    src, tgt_in, tgt_out = batch()
    parts = (slice(0, 3), slice(3, 6))
    return [Batch(src[p], tgt_in[p], tgt_out[p], list(range(6))[p], int(tgt_out[p].ne(0).sum())) for p in parts]


def trainer(model: EncoderDecoder) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    opt = build_optimizer(model, default_optim(lr=1e-2))
    return opt, build_scheduler(opt, 1e-2, ScheduleConfig(0, "constant"), 10)


def test_a_step_clips_every_attention_kind_to_tau_on_its_own_batch_and_records_it():
    tau = 0.05  # below every head's max logit at init: every head of the model is clipped
    model = make(n=2)  # dropout 0: a forward after the step sees what the step's forward saw
    clip = QKClip(model, QKClipConfig(tau=tau))
    # lr 0: the weights after the step are the clipped ones (with an update, the clip answers the logits of the
    # weights before it, as in K2, and the max logit after the step is not bounded by tau).
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    micro = micro_batches()
    tele = Telemetry(model, ONLY_QK_CLIP)
    train_step(model, micro, opt, sched, tele, step_options(micro, clip, record=True))
    record = tele.collect()
    assert record["optim/qk_clip_count"] == 2 * 3 * H  # 2 layers x (enc self, dec self, cross) x H heads
    assert 0 < record["optim/qk_clip_min_factor"] < 1
    per_micro = [watched_max(model, clip, b.src, b.tgt_in) for b in micro]
    assert sorted(per_micro[0]) == [f"{s}.{i}.{a}" for s, i, a in SITES]
    # The step's max over both micro-batches is tau for every head of the first self-attentions, whose inputs are the
    # embeddings; every other attention's inputs passed through attentions clipped in the same step, so their max
    # logits moved (K2 clips every layer from the same forward too) and only the clip itself is checked there.
    for where in ("enc.0.self_attn", "dec.0.self_attn"):
        step_max = torch.maximum(per_micro[0][where], per_micro[1][where])
        assert step_max == pytest.approx([tau] * H, rel=1e-5), where


def test_a_tau_no_head_reaches_trains_bit_identically_to_qk_clip_off():
    runs = []
    for clip_on in (True, False):
        model = make(n=1, dropout=0.1)  # dropout: the hooks must not draw from the RNG either
        opt, sched = trainer(model)
        clip = QKClip(model, QKClipConfig(tau=1e30)) if clip_on else None
        torch.manual_seed(1)
        micro = micro_batches()
        tele = Telemetry(model, TelemetryConfig(every=0))
        losses = [train_step(model, micro, opt, sched, tele, step_options(micro, clip)).loss for _ in range(2)]
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    (on_losses, on_weights), (off_losses, off_weights) = runs
    assert all(torch.equal(a, b) for a, b in zip(on_losses, off_losses, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(on_weights, off_weights, strict=True))


@pytest.mark.parametrize("optim", ["adamw", "muon"])  # the clip acts on the weights after either optimizer's update
def test_train_logs_the_clip_at_telemetry_records_and_defaults_to_off(optim, tmp_path):
    quick = ["trainer.max_steps=3", "telemetry.every=1", "trainer.eval_max_examples=8", "trainer.test_max_examples=8"]
    cfg = make_cfg(f"optim={optim}", "optim.qk_clip={tau: 1.0}", *quick)
    assert validate(cfg).optim.qk_clip == QKClipConfig(tau=1.0, alpha=0.5)
    train_module.train(cfg, tmp_path / "on")
    rows = [json.loads(line) for line in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()]
    clipped = [r for r in rows if "optim/qk_clip_count" in r]
    assert [r["step"] for r in clipped] == [1, 2, 3]
    assert all(0 < r["optim/qk_clip_min_factor"] <= 1 for r in clipped)
    assert clipped[0]["optim/qk_clip_count"] > 0  # tau 1: the initial weights' logits exceed it (12 heads of 24 here)
    assert validate(make_cfg()).optim.qk_clip is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("{tau: 0}", "optim.qk_clip.tau=0 is invalid"),
        ("{tau: -1.5}", "optim.qk_clip.tau=-1.5 is invalid"),
        ("{tau: 100, alpha: 1.5}", "optim.qk_clip.alpha=1.5 is invalid"),
        ("{tau: 100, alpha: -0.1}", "optim.qk_clip.alpha=-0.1 is invalid"),
        ("{tau: 100, beta: 1}", "optim.qk_clip.beta is not a key of optim.qk_clip; valid keys: tau, alpha"),
        ("{alpha: 0.5}", "optim.qk_clip.tau is missing"),
        ("3", "optim.qk_clip=3 is invalid"),
    ],
)
def test_bad_qk_clip_settings_are_one_line_errors_naming_the_value(override, message):
    with pytest.raises(ValueError, match=f"^{message.replace('.', '[.]')}") as err:
        validate(make_cfg(f"optim.qk_clip={override}"))
    assert "\n" not in str(err.value)


def test_no_head_above_tau_records_a_count_of_0_and_a_factor_of_1():
    model = make(n=1)
    clip, stats = QKClip(model, QKClipConfig(tau=1e30)), {}
    src, tgt_in, _ = batch()
    with clip.watch(src.eq(0), tgt_in.eq(0)), torch.no_grad():
        model(src, tgt_in)
    assert torch.equal(clip.clip(stats=stats), torch.ones(3, H))
    assert {k: v.item() for k, v in stats.items()} == {"optim/qk_clip_count": 0.0, "optim/qk_clip_min_factor": 1.0}
    with pytest.raises(RuntimeError, match="no forward pass was watched"):
        clip.clip()


def test_qk_norm_and_compile_are_refused():
    with pytest.raises(ValueError, match="^optim.qk_clip rescales W_q and W_k, which a QK-norm undoes .enc.0.self_attn"):
        build_qk_clip(make(n=1, qk="layernorm"), QKClipConfig(tau=100), compile=False)
    with pytest.raises(ValueError, match=f"^{COMPILE_REFUSED}$"):
        build_qk_clip(make(n=1), QKClipConfig(tau=100), compile=True)
    assert build_qk_clip(make(n=1), None, compile=True) is None


@pytest.mark.dist
def test_two_ranks_clip_alike_and_train_as_one_process(tmp_path):
    # The max logits are all-reduced with MAX: two ranks of one micro-batch each clip as one process with two.
    args = [*DEFAULTS, "trainer.max_steps=6", "optim.qk_clip={tau: 1.0}", "telemetry.every=3"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    run([*launcher, str(ROOT / "train.py"), *args], tmp_path)
    (run_dir,) = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert_trains_as_one_process(run_dir, tmp_path, args, [1, 3, 5, 6])
