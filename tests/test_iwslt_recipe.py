"""The IWSLT preset against fairseq's transformer_iwslt_de_en recipe: the inverse_sqrt schedule,
separate attention / activation dropout, no gradient clipping, and the preset's values."""

import json
import math
from contextlib import nullcontext

import pytest
import torch
from hydra import compose, initialize_config_dir

import train as train_module
from data.batching import Batch
from model.attention import MultiHeadAttention
from model.config import ModelConfig
from model.layers import FeedForward
from model.transformer import EncoderDecoder
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.config import ROOT, make_cfg, model_config, scheduled_lrs
from training.optim import build_optimizer, build_scheduler
from training.presets import default_optim
from training.run import config_diff
from training.schema import ScheduleConfig, validate
from training.step import StepOptions, train_step


def normlab_lr(s: int, peak: float, warmup: int) -> float:
    """The documented closed form: LinearLR warmup from peak / W, then peak * sqrt(W / s)."""
    return peak * (1 / warmup + (1 - 1 / warmup) * s / warmup) if s < warmup else peak * math.sqrt(warmup / s)


def fairseq_lr(s: int, peak: float, warmup: int) -> float:
    """fairseq's InverseSquareRootSchedule.step_update(s) with warmup_init_lr = 0 (its default)."""
    return peak * s / warmup if s < warmup else peak * warmup**0.5 * s**-0.5


def test_inverse_sqrt_follows_its_closed_form_and_fairseq():
    peak, warmup = 5e-4, 8
    ran = scheduled_lrs(peak, warmup, max_steps=60, n=60, decay="inverse_sqrt")
    assert ran == pytest.approx([normlab_lr(s, peak, warmup) for s in range(60)], rel=1e-12, abs=0)
    assert ran[warmup:] == pytest.approx([fairseq_lr(s, peak, warmup) for s in range(warmup, 60)], rel=1e-12, abs=0)
    assert max(abs(a - fairseq_lr(s, peak, warmup)) for s, a in enumerate(ran)) <= peak / warmup  # the warmup's start
    assert scheduled_lrs(peak, warmup, max_steps=10**6, n=60, decay="inverse_sqrt") == ran  # no dependence on the run's length
    assert scheduled_lrs(peak, warmup, max_steps=60, n=40, decay="inverse_sqrt", start=20) == ran[20:]  # a resume replays it


@pytest.mark.parametrize("step", [0, 1, 3999, 4000, 4001, 16000, 50000])
def test_inverse_sqrt_at_the_presets_warmup_after_a_replay(step):
    lr = scheduled_lrs(5e-4, 4000, max_steps=50000, n=1, decay="inverse_sqrt", start=step)[0]
    expected = {0: 1.25e-7, 4000: 5e-4, 16000: 2.5e-4, 50000: 5e-4 * math.sqrt(0.08)}.get(step, normlab_lr(step, 5e-4, 4000))
    assert lr == pytest.approx(expected, rel=1e-12)
    assert abs(lr - fairseq_lr(step, 5e-4, 4000)) <= 1.25e-7


def test_inverse_sqrt_without_warmup_is_refused_with_the_alternatives():
    message = "schedule.decay=inverse_sqrt needs schedule.warmup_steps >= 1, got 0"
    with pytest.raises(ValueError, match=message):
        ScheduleConfig(warmup_steps=0, decay="inverse_sqrt")
    with pytest.raises(ValueError, match=message + r".*use schedule.decay=linear, cosine or constant"):
        validate(make_cfg("schedule.decay=inverse_sqrt", "schedule.warmup_steps=0"))
    with pytest.raises(ValueError, match="valid: linear, cosine, constant, inverse_sqrt"):
        validate(make_cfg("schedule.decay=exp"))


def dropout_model(**dropouts: float | None) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=20, tgt_vocab=24, d_model=32, n_heads=4, d_ff=64, n_enc_layers=2, n_dec_layers=2, **dropouts)
    return EncoderDecoder(cfg).train()


def set_inner_dropouts(model: EncoderDecoder, attn: float, act: float) -> EncoderDecoder:
    """``model`` with its attention-weight and FFN-activation dropouts set by hand."""
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.dropout = attn
        elif isinstance(m, FeedForward):
            m.dropout.p = act
    return model


def train_mode_logits(model: EncoderDecoder) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 20, (3, 9), generator=gen), torch.randint(4, 24, (3, 7), generator=gen)
    torch.manual_seed(2)  # the same dropout masks wherever the same dropouts run
    return model(src, tgt)


@pytest.mark.parametrize(("attn", "act"), [(0.0, 0.0), (0.5, 0.0), (0.0, 0.5)])
def test_attn_and_act_dropout_reach_only_their_modules(attn, act):
    model = dropout_model(dropout=0.3, attn_dropout=attn, act_dropout=act)
    reference = set_inner_dropouts(dropout_model(dropout=0.3), attn, act)  # embeddings and branches keep 0.3
    assert torch.equal(train_mode_logits(model), train_mode_logits(reference))
    assert not torch.equal(train_mode_logits(model), train_mode_logits(dropout_model(dropout=0.3)))
    residual_ps = {m.p for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and "ffn.branch" not in name}
    assert residual_ps == {0.3}


def test_unset_attn_and_act_dropout_are_model_dropout_and_old_checkpoints_match():
    model = dropout_model(dropout=0.3)
    assert {m.dropout for m in model.modules() if isinstance(m, MultiHeadAttention)} == {0.3}
    assert {m.dropout.p for m in model.modules() if isinstance(m, FeedForward)} == {0.3}
    old = {k: v for k, v in model.cfg.to_dict().items() if k not in ("attn_dropout", "act_dropout")}  # abc122c's keys
    assert config_diff(old, model.cfg.to_dict()) == ""  # a resume from it is not refused
    old["norm"] = model.cfg.norm
    assert ModelConfig(**old) == model.cfg
    with pytest.raises(ValueError, match=r"model.attn_dropout must be null \(= model.dropout\) or in \[0, 1\), got 1.0"):
        ModelConfig(src_vocab=20, tgt_vocab=24, attn_dropout=1.0)


def test_no_grad_clip_steps_with_the_unclipped_gradient():
    gen = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, 20, (8, 9), generator=gen), torch.randint(4, 24, (8, 8), generator=gen)
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], list(range(8)), 8 * 7)
    grads = {}
    for clip in (None, 0.5):
        model = dropout_model(dropout=0.0)
        opt = build_optimizer(model, default_optim(lr=1e-3, weight_decay=0.0, eps=1e-8))
        sched = build_scheduler(opt, 1e-3, ScheduleConfig(0, "constant"), 10)
        norm = train_step(
            model,
            [batch],
            opt,
            sched,
            Telemetry(model, TelemetryConfig(every=0)),
            StepOptions(world=1, label_smoothing=0.1, grad_clip=clip, autocast=nullcontext(), step_tokens=56),
        )[1]
        grads[clip] = (norm, torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    (norm, stepped), (norm_clip, stepped_clip) = grads[None], grads[0.5]
    assert norm == norm_clip > 1  # the logged norm is the unclipped one either way
    assert stepped == norm and stepped_clip == pytest.approx(0.5, rel=1e-5)


def test_a_run_without_grad_clip_trains_and_logs_the_unclipped_norm(tmp_path):
    cfg = make_cfg("trainer.grad_clip=null", "trainer.max_steps=4", "trainer.log_every=1", "telemetry.every=0",
                   "trainer.eval_max_examples=10", "trainer.test_max_examples=10")  # fmt: skip
    train_module.train(cfg, tmp_path)
    rows = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "optim/grad_norm" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["optim/grad_norm"] == r["optim/grad_norm_clipped"] > 1 for r in rows)  # clip 1.0 would have cut each
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]
    with pytest.raises(ValueError, match=r"trainer.grad_clip=0 is invalid; it must be null \(no clipping\) or a finite"):
        validate(make_cfg("trainer.grad_clip=0"))


# fairseq's IWSLT'14 De-En command (examples/translation/README.md) and the defaults it leaves:
# transformer_iwslt_de_en / base_architecture (fairseq/models/transformer/transformer_legacy.py),
# adam_eps (fairseq/optim/adam.py).
RECIPE = {
    "model.d_model": 512, "model.d_ff": 1024, "model.n_heads": 4, "model.n_enc_layers": 6, "model.n_dec_layers": 6,
    "model.dropout": 0.3, "model.attn_dropout": 0.0, "model.act_dropout": 0.0, "model.tie_embeddings": True,
    "norm.placement": "post", "norm.kind": "layernorm",
    "optim.lr": 5e-4, "optim.betas": [0.9, 0.98], "optim.eps": 1e-8, "optim.weight_decay": 1e-4,
    "schedule.decay": "inverse_sqrt", "schedule.warmup_steps": 4000,
    "trainer.grad_clip": None, "trainer.label_smoothing": 0.1, "trainer.max_tokens": 4096,
    "decode.beam_size": 5, "decode.max_len_a": 1.2, "decode.max_len_b": 10,
}  # fmt: skip


def test_the_iwslt_preset_composes_with_the_recipes_values():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=iwslt_de_en"])
        pre = compose("config", overrides=["+experiment=iwslt_de_en", "norm=pre_ln"])
    for key, value in RECIPE.items():
        section, name = key.split(".")
        got = cfg[section][name]
        assert (list(got) if key == "optim.betas" else got) == value, key
    assert pre.norm.placement == "pre"  # the norm stays a command-line choice
    validate(cfg)
    mcfg = model_config(cfg, 10000, 10000)
    assert (mcfg.attn_dropout_p, mcfg.act_dropout_p, mcfg.dropout) == (0.0, 0.0, 0.3)
