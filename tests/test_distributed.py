"""torchrun with 2 CPU processes (gloo): one shared run dir, rank-0-only files, the same training as
one process with twice the batch (2 accumulation steps), under the default cadences and under
cadences that are not multiples of each other, and under ``optim=muon``; exact resume of every rank's RNG stream; legacy
launchers that pass ``--local-rank``."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.config import ROOT
from tests.helpers.distributed import DEFAULTS, assert_trains_as_one_process, run
from training.checkpoint import load_checkpoint
from training.distributed import strip_local_rank
from training.spikes import SpikeScore

# log 5, telemetry 3, eval 7, checkpoint 4: each decides a different set of steps, so a rank that
# enters a collective on its own (a rank-0-only decision) would hang here.
SKEWED = [*DEFAULTS, "trainer.max_steps=12", "telemetry.every=3", "trainer.eval_every=7", "trainer.checkpoint_every=4"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
LEGACY = [sys.executable, "-m", "torch.distributed.launch", "--standalone", "--nproc_per_node=2"]


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.dist
@pytest.mark.parametrize(("args", "logged", "launcher"), [
    (DEFAULTS, [1, 5, 10, 15, 20], TORCHRUN),  # step 1: telemetry at init
    (SKEWED, [1, 3, 4, 5, 6, 7, 8, 9, 10, 12], LEGACY),  # the legacy launcher appends --local-rank=N
])  # fmt: skip
def test_two_ranks_train_exactly_as_one_process_with_twice_the_batch(tmp_path, args, logged, launcher):
    two = run([*launcher, str(ROOT / "train.py"), *args], tmp_path)
    (run_dir,) = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]  # both ranks wrote into one dir
    assert run_dir.name.endswith("_pre-layernorm-custom")  # named from the norm keys (conf/config.yaml)
    assert_trains_as_one_process(run_dir, tmp_path, args, logged)  # rank 0 alone writes: each logged step once
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("act/enc.0.out/rms" in r for r in rows)  # telemetry from rank 0
    assert two.stdout.count("test PER") == 1  # one summary: rank 0's


@pytest.mark.dist
def test_two_ranks_train_under_optim_muon_as_one_process_with_twice_the_batch(tmp_path):
    # Muon's update is a function of the gradient DDP averaged, so every rank steps alike; its Newton-Schulz
    # iteration runs in bf16, whose rounding of the (float32-equal) gradients is what the tolerance allows.
    args = [*DEFAULTS, "optim=muon"]
    run([*TORCHRUN, str(ROOT / "train.py"), *args, f"hydra.run.dir={tmp_path / 'two'}"], tmp_path)
    assert_trains_as_one_process(tmp_path / "two", tmp_path, args, [1, 5, 10, 15, 20])


# Run as `torchrun ... sigterm.py <overrides>`: both ranks get SIGTERM in their 3rd step, as a
# cluster's preemption would deliver it; the ranks agree at the next logging step and checkpoint.
SIGTERM_AT_STEP_3 = f"""
import os, runpy, signal, sys
sys.path.insert(0, {str(ROOT)!r})
import training.step
real, calls = training.step.train_step, [0]
def train_step(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 3:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
training.step.train_step = train_step  # train.py imports it from here
runpy.run_path({str(ROOT / "train.py")!r}, run_name="__main__")
"""


@pytest.mark.dist
def test_two_ranks_stopped_and_resumed_continue_each_rank_rng_stream_exactly(tmp_path):
    args = [*DEFAULTS, "model.dropout=0.1"]  # dropout: each rank's RNG stream shows in every loss
    run([*TORCHRUN, str(ROOT / "train.py"), *args, f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path)
    (tmp_path / "sigterm.py").write_text(SIGTERM_AT_STEP_3)
    stopped = tmp_path / "stopped"
    out = run([*TORCHRUN, str(tmp_path / "sigterm.py"), *args, f"hydra.run.dir={stopped}"], tmp_path, ok=False)
    assert "stopped by SIGTERM after step 5" in out.stderr
    ckpt = load_checkpoint(stopped / "checkpoint.pt")
    assert ckpt["step"] == 5 and len(ckpt["rng"]) == 2  # one stream per rank
    assert not torch.equal(ckpt["rng"][0]["torch"], ckpt["rng"][1]["torch"])
    run([*TORCHRUN, str(ROOT / "train.py"), *args, f"hydra.run.dir={stopped}"], tmp_path)  # train.resume=auto

    straight, resumed = losses(tmp_path / "straight"), losses(stopped)
    assert sorted(resumed) == [1, 5, 10, 15, 20]
    assert resumed == straight  # bit for bit at every logged step
    a, b = load_checkpoint(tmp_path / "straight" / "checkpoint.pt")["model"], load_checkpoint(stopped / "checkpoint.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# Run as `torchrun ... per_rank.py <overrides>` in the test's dir: each rank writes rank<RANK>.jsonl, one line
# per micro-batch (its token-mean cross-entropy, z-loss term and real target tokens, as token_losses returns
# them) and one per step (the gradient norm train_step returns), read back without changing a value; and shutdown<RANK>: the
# run's state (status.json) when that rank ends its process group.
PER_RANK_VALUES = f"""
import json, os, runpy, sys
sys.path.insert(0, {str(ROOT)!r})
import training.step
from data.tokenizer import PAD_ID
log = open("rank" + os.environ["RANK"] + ".jsonl", "w")
real_losses, real_step = training.step.token_losses, training.step.train_step
def token_losses(logits, tgt_out, options):
    ce, z = real_losses(logits, tgt_out, options)
    log.write(json.dumps(dict(ce=ce.item(), z=z.item(), tokens=int(tgt_out.ne(PAD_ID).sum()))) + "\\n")
    return ce, z
def train_step(*args, **kwargs):
    result = real_step(*args, **kwargs)
    log.write(json.dumps(dict(grad_norm=result.grad_norm.item())) + "\\n")
    log.flush()
    return result
training.step.token_losses, training.step.train_step = token_losses, train_step  # train.py imports train_step from here
import pathlib, training.distributed
real_shutdown = training.distributed.shutdown
def shutdown():  # the run's state as this rank sees it when it tears its process group down
    run_dir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("hydra.run.dir="))
    state = json.loads((pathlib.Path(run_dir) / "status.json").read_text())["state"]
    pathlib.Path("shutdown" + os.environ["RANK"]).write_text(state)
    real_shutdown()
training.distributed.shutdown = shutdown  # train.py calls distributed.shutdown()
runpy.run_path({str(ROOT / "train.py")!r}, run_name="__main__")
"""


def per_rank_steps(path: Path) -> list[dict]:
    """Each step of one rank's ``rank<RANK>.jsonl``: {"micro": [its micro-batches' lines], "grad_norm": ...}."""
    steps, micro = [], []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "grad_norm" in row:
            steps.append({"micro": micro, "grad_norm": row["grad_norm"]})
            micro = []
        else:
            micro.append(row)
    return steps


@pytest.mark.dist
def test_two_ranks_log_z_loss_and_spike_scores_of_every_rank_s_tokens(tmp_path):
    """2 ranks, default cadences (log every 5, telemetry at 1 and 20, checkpoints at 10 and 20), optim.z_loss=1e-4.

    Definitions (training/step.py, training/window.py, docs/telemetry.md): a step's loss and z-loss are the means
    over every real target token of the step, all micro-batches of all ranks, i.e. each rank's token-mean
    weighted by its token count (not the plain mean over ranks); ``train/loss`` and ``train/z_loss`` average
    them over the steps of the logging window. The spike scores are fed every step's loss so defined and the
    global gradient norm (the same on every rank); with 20 steps, fewer than the 100 values a spike needs,
    both scores are 0, and the checkpoint's window holds the 20 values themselves. A hang in the logging
    window's all-reduce would end in ``run``'s timeout.
    """
    (tmp_path / "per_rank.py").write_text(PER_RANK_VALUES)
    run_dir = tmp_path / "run"
    run([*TORCHRUN, str(tmp_path / "per_rank.py"), *DEFAULTS, "optim.z_loss=1e-4", f"hydra.run.dir={run_dir}"], tmp_path)

    ranks = [per_rank_steps(tmp_path / f"rank{r}.jsonl") for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 20
    loss, z_loss, grad_norm, plain = [], [], [], []  # plain: the mean over ranks of their z-loss, a wrong definition
    for both in zip(*ranks, strict=True):
        micro = [m for step in both for m in step["micro"]]
        tokens = sum(m["tokens"] for m in micro)
        loss.append(sum(m["ce"] * m["tokens"] for m in micro) / tokens)
        z_loss.append(sum(m["z"] * m["tokens"] for m in micro) / tokens)
        plain.append(np.mean([m["z"] for m in micro]))
        assert both[0]["grad_norm"] == both[1]["grad_norm"]  # all-reduced gradients: one global norm
        grad_norm.append(both[0]["grad_norm"])

    rows = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "train/loss" in r}
    assert sorted(rows) == [1, 5, 10, 15, 20]
    spikes = {"loss": SpikeScore(), "grad_norm": SpikeScore()}
    for first, last in [(1, 1), (2, 5), (6, 10), (11, 15), (16, 20)]:  # the logging windows
        window = slice(first - 1, last)
        assert rows[last]["train/loss"] == pytest.approx(np.mean(loss[window]), rel=1e-6)
        assert rows[last]["train/z_loss"] == pytest.approx(np.mean(z_loss[window]), rel=1e-6)
        assert rows[last]["train/z_loss"] != pytest.approx(np.mean(plain[window]), rel=1e-6)  # the ranks' tokens differ
        spikes["loss"].add(loss[window])
        spikes["grad_norm"].add(grad_norm[window])
        for name, score in spikes.items():
            assert rows[last][f"train/spike_score_{name}"] == score.score
    # Rank 0's first micro-batch is the one telemetry reads out/logz = mean log Z from at step 1:
    # mean (log Z)^2 >= (mean log Z)^2, and log Z varies little between tokens at init.
    assert rows[1]["out/logz"] ** 2 <= ranks[0][0]["micro"][0]["z"] / 1e-4 <= 1.01 * rows[1]["out/logz"] ** 2

    # Rank 1 tears its process group down only once rank 0 has tested (gloo can abort a rank that leaves early).
    assert [(tmp_path / f"shutdown{r}").read_text() for r in (0, 1)] == ["finished", "finished"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["spike_score_loss"] == status["spike_score_grad_norm"] == 0.0
    state = load_checkpoint(run_dir / "checkpoint.pt")["spikes"]
    assert state["loss"]["history"] == pytest.approx(loss, rel=1e-6) and state["grad_norm"]["history"] == grad_norm
    assert state["loss"]["steps"] == state["grad_norm"]["steps"] == 20 and state["loss"]["spikes"] == 0


def test_legacy_local_rank_flags_are_removed_and_set_local_rank(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert strip_local_rank(["train.py", "--local-rank=1", "model=tiny"]) == ["train.py", "model=tiny"]
    assert os.environ["LOCAL_RANK"] == "1"
    monkeypatch.setenv("LOCAL_RANK", "0")  # a launcher's own LOCAL_RANK wins
    assert strip_local_rank(["train.py", "--local_rank", "3", "seed=1"]) == ["train.py", "seed=1"]
    assert os.environ["LOCAL_RANK"] == "0"
