"""training/loggers.py: wandb plots every per-step metric, telemetry included, against ``trainer/step``; metrics.jsonl
holds each step once across a run dir's attempts."""

import json

import pytest

from runlog.metric_names import (
    FAMILIES,
    act,
    adam_below_eps,
    adam_rms,
    attn_max_logit,
    batch_stat_dist,
    grad_norm,
    hc_gain,
    learned_scale,
    output_logits,
    weight_spectrum,
)
from training import loggers

# one name of each telemetry family
SAMPLES = [
    act("dec", 1, "cross_attn.k_norm", "kurtosis"),
    grad_norm("enc", 0),
    adam_rms("dec", 1),
    attn_max_logit("dec", 1, "cross_attn"),
    weight_spectrum("dec", 1, "cross_attn.v", "sigma_max"),
    learned_scale("enc", 0, "ffn.norm_in", "gain_mean"),
    output_logits("logz"),
    adam_below_eps(),
    batch_stat_dist("enc", None, "final_norm", "var"),
    hc_gain("dec", "fwd_gain"),
]


class FakeRun:
    """Records ``define_metric`` calls as a ``wandb.Run`` would receive them."""

    id, dir = "abc123", "unused"

    def __init__(self) -> None:
        self.defined: list[tuple[str, dict]] = []

    def define_metric(self, name: str, **kwargs) -> None:
        self.defined.append((name, kwargs))


def test_every_telemetry_family_is_plotted_against_the_trainer_step(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    run = FakeRun()
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    assert loggers.start_wandb(tmp_path, {"project": "normlab"}, resume_step=0, last_logged=0) is run
    assert run.defined[0] == ("trainer/step", {})
    globs = [name for name, kwargs in run.defined if kwargs == {"step_metric": "trainer/step"}]
    assert len(globs) == len(run.defined) - 1 == len(set(globs))
    assert all(g.endswith("/*") and "*" not in g[:-1] for g in globs)  # prefix globs: all wandb supports
    assert {m.family for m in SAMPLES} == set(FAMILIES)  # a new family needs a sample here
    # wandb-core matches a glob by the prefix before its "*" (internal/runmetric, matchGlobMetric)
    for name in [m.name for m in SAMPLES] + ["train/loss", "val/per", "test/bleu", "optim/lr", "perf/tokens_per_s"]:
        assert [g for g in globs if name.startswith(g[:-1])] == [f"{name.split('/')[0]}/*"], name


@pytest.mark.parametrize(("resume_step", "kept", "next_step"), [(0, [], 0), (5, [0, 1, 2, 3, 4, 5], 6)])
def test_metrics_jsonl_keeps_an_earlier_attempts_rows_up_to_the_resume_step_and_none_on_a_fresh_start(
    tmp_path, resume_step, kept, next_step
) -> None:
    # An earlier attempt in this dir logged steps 0 (the loss at initialization) to 8; its checkpoint is at step 5.
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "val/loss": 4.0 - s / 10}) + "\n" for s in range(9)))
    logger = loggers.MetricsLogger(tmp_path, None, resume_step=resume_step)
    logger.log(next_step, {"val/loss": 3.0})  # a fresh start logs its own step 0; a resumed run goes on after 5
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [*kept, next_step]  # one step-0 row either way
    assert [r["val/loss"] for r in rows] == [4.0 - s / 10 for s in kept] + [3.0]


def test_wandb_prints_nothing_and_normlabs_summary_is_the_last_output(tmp_path, monkeypatch, capfd) -> None:
    import train as train_module
    from tests.helpers.config import make_cfg

    for name in ("WANDB_API_KEY", *loggers.WANDB_OUTPUT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    train_module.train(make_cfg("logger=wandb", "trainer.max_steps=5"), tmp_path)
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("wandb:") or "wandb online" in line] == []  # no banner, no summary
    hint = f"wandb is offline (no API key found); upload every attempt of this run later with: wandb sync {tmp_path / 'wandb'}"
    assert hint in lines  # normlab's own line about offline wandb stays
    table = out.splitlines()[-8:]  # print_summary's rows, the last thing printed (PER, WER, 1-ref PER, 1-ref WER)
    assert [row.split()[0] for row in table] == ["run", "norm", "steps", "tested", "test", "test", "test", "test"]
    assert table[0].split() == ["run", "dir", str(tmp_path)] and table[2].split() == ["steps", "5"]
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))  # wandb still wrote its run


def test_a_run_whose_wandb_service_is_killed_goes_on_to_its_end_without_it(tmp_path, monkeypatch, capfd) -> None:
    # What SLURM does to a preempted job: SIGTERM to every process of it, wandb's service (wandb-core) too, which exits
    # at once. The run must still end as it would have (the requeue of tests/test_wandb_online.py needs its checkpoint).
    import os
    import signal
    import subprocess

    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = loggers.MetricsLogger(tmp_path, {"project": "p", "name": "n"})
    logger.log(1, {"train/loss": 3.0})
    (core,) = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "wandb-core"], capture_output=True, text=True).stdout.split()
    os.kill(int(core), signal.SIGTERM)
    os.waitpid(int(core), 0)
    logger.log(2, {"train/loss": 2.0})
    logger.log(3, {"train/loss": 1.0})
    logger.close("interrupted")
    out = capfd.readouterr().out
    assert out.count("normlab: wandb's service process is gone (") == 1  # said once, then wandb is left alone
    assert [json.loads(line)["train/loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [3, 2, 1]
    run = wandb.init(project="p", mode="offline", dir=str(tmp_path / "again"))  # the next attempt starts a service anew
    run.finish()
