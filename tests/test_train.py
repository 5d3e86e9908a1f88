"""train(cfg) end to end on tiny settings: presets, metrics file, resume, bad input."""

import copy
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import train as train_module
import training.run
import training.step
from model.transformer import EncoderDecoder
from tests.helpers.config import ROOT, make_cfg, model_config
from tests.helpers.resume import poison_loss_at
from training.checkpoint import load_checkpoint
from training.evaluate import evaluate_loss
from training.schema import validate
from training.tasks import build_task

PRESETS = sorted(p.stem for p in (ROOT / "conf" / "norm").glob("*.yaml"))
# Each preset as written, plus the native impl of the presets whose kind has one.
PRESET_RUNS = [(p, None) for p in PRESETS] + [(p, "native") for p in ("post_ln", "pre_ln", "pre_rms", "post_rms")]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("preset", "impl"), PRESET_RUNS)
def test_every_norm_preset_trains_with_finite_decreasing_loss(preset, impl, tmp_path):
    result = train_module.train(make_cfg(f"norm={preset}", *([f"norm.impl={impl}"] if impl else [])), tmp_path)
    losses = [m["train/loss"] for m in read_metrics(tmp_path) if "train/loss" in m]
    assert all(torch.isfinite(torch.tensor(losses)))
    # From about ln(vocab) ~ 3.8 toward the unigram entropy. 0.2, not more: pre_dyt_lm's final DyT alpha 0.2 (the
    # LLaMA2-7B value) shrinks the first logits, so it starts at ln(vocab), not above it (3.83 vs pre_dyt's 4.04), and
    # ends where pre_dyt does (3.58 vs 3.55): a drop of 0.245 in these steps.
    assert losses[-1] < losses[0] - 0.2
    assert 0 <= result["test/wer"] <= 1 and result["test/per"] >= 0


def test_run_dir_holds_named_metrics_config_checkpoint_and_vocab(tmp_path):
    train_module.train(make_cfg("norm=post_ln"), tmp_path)
    rows = read_metrics(tmp_path)
    keys = set().union(*rows)
    expected = {"train/loss", "val/loss", "val/per", "val/wer", "test/per", "test/wer", "optim/lr", "perf/tokens_per_s"}
    expected |= {f"act/{s}.{i}.out/rms" for s in ("enc", "dec") for i in range(2)}
    expected |= {f"grad/{s}.{i}/norm" for s in ("enc", "dec") for i in range(2)}
    assert expected <= keys
    assert "val/loss_batch_stats" not in keys  # no batch-reading norm: no second validation loss
    assert all("step" in r for r in rows)
    act = [r["act/enc.1.out/rms"] for r in rows if "act/enc.1.out/rms" in r]
    assert len(act) == 5 and all(a > 0 for a in act)  # steps 1 (init), 5, 10, 15, 20 with telemetry.every=5
    cfg = OmegaConf.load(tmp_path / "config.yaml")
    assert cfg.norm.placement == "post" and cfg.model.d_model == 32
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["step"] == 20 and ckpt["model_config"]["norm"]["placement"] == "post"
    assert (tmp_path / "src_vocab.json").is_file() and (tmp_path / "tgt_vocab.json").is_file()


def test_the_first_row_is_the_valid_loss_at_initialization(tmp_path):
    cfg = make_cfg("seed=3", "model.dropout=0.3", "trainer.max_steps=2")  # dropout: the loss must be eval mode's
    train_module.train(cfg, tmp_path)
    first, *rest = read_metrics(tmp_path)
    # The same model built by hand: seeded as start_run seeds it, then initialized.
    torch.manual_seed(cfg.seed)
    task = build_task(validate(cfg), None, None)
    sizes = task.src_vocab.get_vocab_size(), task.tgt_vocab.get_vocab_size()
    model = EncoderDecoder(replace(model_config(cfg, *sizes), share_embeddings=task.share_embeddings))
    expected = evaluate_loss(model, task.data["valid"], cfg.trainer.max_tokens, torch.device("cpu"))
    assert first.keys() == {"step", "val/loss"} and first["step"] == 0
    assert first["val/loss"] == pytest.approx(expected, abs=1e-6)
    assert all(r["step"] >= 1 for r in rest)  # nothing else is logged before the first update


def test_the_step_0_evaluation_leaves_training_bit_identical(tmp_path, monkeypatch):
    # Dropout on and a per-step log, so a random number drawn, or a mode left switched, shows in every loss.
    overrides = ["trainer.max_steps=6", "trainer.log_every=1", "model.dropout=0.1", "telemetry.every=3"]
    train_module.train(make_cfg(*overrides), tmp_path / "with")
    monkeypatch.setattr(training.run, "log_init_loss", lambda run: None)  # train.py imports it at run time
    train_module.train(make_cfg(*overrides), tmp_path / "without")

    def untimed(run_dir: Path) -> list[dict]:  # perf/ and mem/ measure the machine, not the training
        return [{k: v for k, v in r.items() if not k.startswith(("perf/", "mem/"))} for r in read_metrics(run_dir)]

    with_init, without = untimed(tmp_path / "with"), untimed(tmp_path / "without")
    assert with_init[0].keys() == {"step", "val/loss"} and with_init[1:] == without  # every later row, bit for bit
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.pt") for d in ("with", "without"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert torch.equal(a["rng"][0]["torch"], b["rng"][0]["torch"]) and a["rng"][0]["python"] == b["rng"][0]["python"]


def test_training_leaves_the_cached_task_data_as_it_found_it(tmp_path):
    cfg = make_cfg("trainer.max_steps=10")
    task = build_task(
        validate(cfg), None, None
    )  # the data and vocabularies every run of this process shares (tasks.g2p._g2p_data)
    before = copy.deepcopy((task.data, task.eval_sets)), task.src_vocab.to_str(), task.tgt_vocab.to_str()
    train_module.train(cfg, tmp_path)  # trains, validates at step 0 and 10, decodes valid and test
    again = build_task(validate(cfg), None, None)
    assert again.data is task.data  # the run used these very objects
    assert ((again.data, again.eval_sets), again.src_vocab.to_str(), again.tgt_vocab.to_str()) == before


def test_plot_scales_draws_pngs_from_a_run(tmp_path):
    import matplotlib.image

    from scripts.plot_scales import main as plot_scales

    train_module.train(make_cfg("norm=pre_ln", "telemetry.every=2"), tmp_path)
    paths = plot_scales([str(tmp_path), "--steps", "2", "20"])
    for path in paths:
        image = matplotlib.image.imread(path)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0  # drawn, not blank


def test_plot_scales_without_telemetry_says_so(tmp_path):
    from scripts.plot_scales import main as plot_scales

    train_module.train(make_cfg("telemetry.every=0", "trainer.max_steps=5"), tmp_path)
    with pytest.raises(ValueError, match="telemetry=off"):
        plot_scales([str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plot_scales([str(tmp_path / "nowhere")])


def test_telemetry_typo_fails_at_start_up(tmp_path):
    with pytest.raises(ValueError, match="unknown telemetry.stats \\['kurt'\\]; valid stats: rms, mean, maxabs, crest, kurtosis"):
        train_module.train(make_cfg("telemetry.stats=[rms,kurt]"), tmp_path)


def test_resume_continues_from_the_checkpoint(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    train_module.train(make_cfg("trainer.max_steps=10"), first)
    train_module.train(make_cfg("trainer.max_steps=20", f"train.resume={first / 'checkpoint.pt'}"), second)
    steps = [r["step"] for r in read_metrics(second) if "train/loss" in r]
    assert steps[0] == 15 and steps[-1] == 20
    assert load_checkpoint(second / "checkpoint.pt")["step"] == 20


def test_resume_with_other_model_settings_names_the_difference(tmp_path):
    train_module.train(make_cfg("trainer.max_steps=5"), tmp_path / "a")
    with pytest.raises(
        ValueError, match="d_model: checkpoint 32, this run 64; .*norm.placement: checkpoint 'pre', this run 'post'"
    ):
        train_module.train(
            make_cfg("model.d_model=64", "norm=post_ln", f"train.resume={tmp_path / 'a' / 'checkpoint.pt'}"), tmp_path / "b"
        )


def test_resume_path_that_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="train.resume=.*nope.pt.: no checkpoint file there"):
        train_module.train(make_cfg(f"train.resume={tmp_path / 'nope.pt'}"), tmp_path)


def test_resume_path_that_is_not_a_checkpoint(tmp_path):
    bogus = tmp_path / "bogus.pt"
    bogus.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="bogus.pt' is truncated or corrupt"):
        train_module.train(make_cfg(f"train.resume={bogus}"), tmp_path / "run")


def test_non_finite_loss_stops_and_keeps_the_last_finite_checkpoint(tmp_path, monkeypatch):
    poison_loss_at(monkeypatch, step=8)
    # The NaN step's update poisons every weight, so step 10's telemetry sees NaN from the embeddings on.
    pattern = r"step 8; first non-finite activation: act/enc.embed/rms; last finite checkpoint: .*checkpoint.pt \(step 5\)"
    with pytest.raises(train_module.NonFiniteLossError, match=pattern):
        train_module.train(make_cfg("trainer.checkpoint_every=5", "trainer.log_every=5"), tmp_path)
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["step"] == 5
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "diverged" and status["diverged_step"] == 8  # what the report reads


def run_cli(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model=tiny", "trainer=smoke", "logger=none", *overrides],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("norm=pre_lm", "unknown norm preset 'pre_lm'; did you mean norm=pre_ln"),
        ("norm.kind=layernrom", "unknown norm.kind 'layernrom'; valid kinds: layernorm, rmsnorm, scalenorm, dyt, dyisru, none"),
        ("norm.impl=fused", "unknown norm.impl 'fused'; valid impls: custom, native"),
        (
            "norm.placement=middle",
            "unknown norm.placement 'middle'; valid placements: post, pre, sandwich, deepnorm, lns, "
            "mix_ln, hybrid, hybrid_star, res_post, admin, keel, b2t, rezero, layerscale, tfixup",
        ),
        ("norm=pre_dyt norm.placement=post", "norm.kind='dyt' cannot be used with norm.placement='post'"),
        ("model.n_heads=3", "d_model=32 is not divisible by model.n_heads=3"),
        ("trainer.device=tpu", "unknown trainer.device 'tpu'; valid: auto, cpu, cuda"),
        ("model.d_modle=64", "model.d_modle is not a key of model; did you mean model.d_model or model.base_d_model?"),
        ("trainer.eval_every=0", "trainer.eval_every=0 is invalid; it must be an integer >= 1"),
        ("optim.lr=-1", "optim.lr=-1 is invalid; it must be a finite number > 0"),
        ("schedule.decay=exp", "schedule.decay='exp' is invalid; valid: linear, cosine, constant, inverse_sqrt"),
        ("telemetry.every=-1", "telemetry.every must be an integer >= 0, got -1"),
        ("trainer.max_tokens=5", "trainer.max_tokens=5 is smaller than the longest row"),
        ("trainer.grad_accum=0", "trainer.grad_accum=0 is invalid; it must be an integer >= 1"),
        ("trainer.compile=yes", "trainer.compile='yes' is invalid: expected a boolean (true or false)"),
    ],
)
def test_cli_bad_input_stops_with_one_clear_message(override, message, tmp_path):
    proc = run_cli(*override.split(), f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") <= 3, proc.stderr


def test_wandb_runs_offline_without_an_api_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    train_module.train(make_cfg("logger=wandb", "trainer.max_steps=5", "norm=post_ln", "seed=3"), tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    record = runs[0].read_bytes()  # the offline run's protobuf log: config, tags and metrics
    assert b"placement=post" in record and b"seed=3" in record and b"act/enc.0.out/rms" in record


def expected_lr(step: int, peak: float, warmup: int, max_steps: int, decay: str) -> float:
    """The rate step ``step`` (1-based) trains with, in closed form: warmup from peak/W to peak over
    the first W = min(warmup, max_steps) steps (torch's LinearLR), then ``decay`` to 0 at max_steps."""
    w = min(warmup, max_steps)
    if step <= w:
        return peak * (1 / w + (1 - 1 / w) * (step - 1) / w)
    j, rest = step - 1 - w, max(max_steps - w, 1)
    return {"linear": peak * (1 - j / rest), "cosine": peak * (1 + math.cos(math.pi * j / rest)) / 2, "constant": peak}[decay]


@pytest.mark.parametrize("overrides", [[], ["schedule.warmup_steps=8"], ["schedule.warmup_steps=8", "schedule.decay=cosine"]])
def test_logged_learning_rate_is_the_one_each_step_trained_with(overrides, tmp_path):
    cfg = make_cfg(*overrides)  # the defaults: warmup 200 cut to the 20-step run
    train_module.train(cfg, tmp_path)
    logged = {r["step"]: r["optim/lr"] for r in read_metrics(tmp_path) if "optim/lr" in r}
    assert sorted(logged) == [1, 5, 10, 15, 20]
    sc = cfg.schedule
    for step, lr in logged.items():
        assert lr == pytest.approx(expected_lr(step, cfg.optim.lr, sc.warmup_steps, 20, sc.decay), rel=1e-9), step
    assert logged[20] > 0  # the last step still trains (it logged 0.0, the rate after it)


def test_wandb_depth_chart_is_titled_with_the_step_its_record_comes_from(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    train_module.train(make_cfg("logger=wandb", "telemetry.every=3"), tmp_path)  # records 1, 3, ..., 18, 20; evals 10, 20
    (record,) = (p.read_bytes() for p in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert b"RMS vs depth, step 9" in record and b"RMS vs depth, step 20" in record
    assert b"RMS vs depth, step 10" not in record  # no record was taken at step 10
