"""logger=wandb online, end to end, against a real wandb-protocol server on loopback (openwandb:
``tests/helpers/wandb_server.py``): what a run logs lands on the server as metrics.jsonl has it, across a SIGTERM and
its resume and a SLURM requeue, for each job of a sweep, with the state the run ended in; and the server's run page
draws its loss."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import wandb

import train as train_module
from tests.helpers.cdp import shoot_element
from tests.helpers.config import ROOT, TINY, make_cfg
from tests.helpers.resume import EXACT, poison_loss_at, rows, stop_by_sigterm
from tests.helpers.runs import chromium
from tests.helpers.slurm_cluster import LAUNCHER, finish, hold_until_signalled, job_dir, job_pid, start_sweep, wait_for
from tests.helpers.wandb_log import wandb_records
from tests.helpers.wandb_server import WandbServer, start_server

WANDB = ["logger=wandb", "trainer.log_every=1"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    started = start_server(tmp_path_factory.mktemp("openwandb"))
    if isinstance(started, str):
        pytest.skip(started)
    yield started
    started.stop()


@pytest.fixture
def online(server: WandbServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[WandbServer]:
    """wandb pointed at the server, online, as a user's environment would point it."""
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_GROUP"):
        monkeypatch.delenv(key, raising=False)
    # wandb reads the environment once per process, at its first use (its singleton keeps the settings): an earlier
    # test of this xdist worker would leave it pointed at W&B's cloud. Tear it down so the next wandb.init reads it anew.
    wandb.teardown()
    yield server
    wandb.teardown()


def logged(run_dir: Path) -> dict[str, dict[int, float]]:
    """{metric: {step: value}} of the run's metrics.jsonl (non-finite values, written as null, left out)."""
    out: dict[str, dict[int, float]] = {}
    for row in rows(run_dir):
        for key, value in row.items():
            if key != "step" and value is not None:
                out.setdefault(key, {})[row["step"]] = value
    return out


def assert_server_has_metrics_jsonl(server: WandbServer, run_id: str, run_dir: Path) -> None:
    history, local = server.history(run_id), logged(run_dir)
    assert local and set(local) <= set(history), sorted(set(local) - set(history))[:5]
    for key, by_step in local.items():  # each step once (server.history checks), none missing, none extra
        assert history[key] == pytest.approx(by_step, rel=1e-12, abs=0), key
    steps = sorted({s for by_step in local.values() for s in by_step})
    assert sorted(history["trainer/step"]) == steps and all(history["trainer/step"][s] == s for s in steps)


def test_a_run_lands_on_the_server_as_metrics_jsonl_has_it(online: WandbServer, tmp_path: Path) -> None:
    test = train_module.train(make_cfg(*WANDB, "logger.project=one_run"), tmp_path)
    status = json.loads((tmp_path / "status.json").read_text())
    (run,) = online.runs("one_run")
    assert (run["run_id"], run["display_name"], run["state"]) == (status["wandb_id"], tmp_path.name, "finished")
    assert set(run["tags"]) == {"kind=layernorm", "impl=custom", "placement=pre", "seed=0"}
    config = {key: entry["value"] for key, entry in run["config"].items() if key != "_wandb"}
    assert config["norm"]["kind"] == "layernorm" and config["trainer"]["max_steps"] == 20 and config["seed"] == 0
    assert_server_has_metrics_jsonl(online, run["run_id"], tmp_path)
    summary = run["summary"]
    assert {k: summary[k] for k in test} == test and summary["run/state"] == "finished" and summary["trainer/step"] == 20
    # What openwandb does not do (docs/config.md says so): keep the run's group (the sweep test reads the one sent from
    # wandb's local record), answer wandb.Api (hence its REST API here).
    assert not [key for key in run if "group" in key]
    with pytest.raises(Exception, match="Unknown operation named"):
        list(wandb.Api(overrides={"base_url": online.url, "entity": "default"}).runs("default/one_run"))


def test_sigterm_and_resume_continue_one_run_with_every_step_once(
    online: WandbServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_cfg(*WANDB, "logger.project=resumed")
    stop_by_sigterm(monkeypatch, cfg, tmp_path, step=7)
    (stopped,) = online.runs("resumed")
    assert stopped["summary"]["run/state"] == "interrupted" and max(online.history(stopped["run_id"])["train/loss"]) == 7
    train_module.train(cfg, tmp_path)
    (run,) = online.runs("resumed")
    assert run["run_id"] == stopped["run_id"] == json.loads((tmp_path / "status.json").read_text())["wandb_id"]
    assert run["state"] == "finished" and run["summary"]["run/state"] == "finished"
    assert sorted(online.history(run["run_id"])["train/loss"]) == list(range(1, 21))
    assert_server_has_metrics_jsonl(online, run["run_id"], tmp_path)


def test_a_diverged_run_says_so_on_the_server(online: WandbServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    poison_loss_at(monkeypatch, step=8)
    with pytest.raises(train_module.NonFiniteLossError):
        train_module.train(make_cfg(*WANDB, "logger.project=diverged"), tmp_path)
    (run,) = online.runs("diverged")
    # openwandb marks every run that ends "finished" (it ignores wandb's exit code, which W&B reads as failed):
    # the summary's run/state is what every server shows.
    assert run["summary"]["run/state"] == "diverged" and max(online.history(run["run_id"])["train/loss"]) == 7


def test_each_job_of_a_sweep_is_one_run_grouped_by_the_sweep(online: WandbServer, tmp_path: Path) -> None:
    env = {**os.environ, **online.env()}
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "model=tiny", "trainer=smoke", "telemetry.every=5", *WANDB,
           "logger.project=sweep", "seed=0,1", "hydra.sweep.dir=multirun/twojobs"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = {json.loads(p.read_text())["wandb_id"]: p.parent for p in (tmp_path / "multirun" / "twojobs").glob("*/status.json")}
    runs = online.runs("sweep")
    assert len(jobs) == 2 and sorted(run["run_id"] for run in runs) == sorted(jobs)
    assert sorted(run["config"]["seed"]["value"] for run in runs) == [0, 1]
    for run in runs:
        job = jobs[run["run_id"]]
        assert run["display_name"] == job.name and run["state"] == "finished"
        assert_server_has_metrics_jsonl(online, run["run_id"], job)
        # openwandb does not keep a run's group: the group normlab sent is read from wandb's local record of the run.
        assert sent_group(job) == "twojobs"


@pytest.mark.slurm
def test_a_requeued_slurm_job_continues_its_run(online: WandbServer, slurm_env: dict[str, str], tmp_path: Path) -> None:
    # A preemption as tests/test_slurm.py makes one: SIGTERM to the job mid-run, then SLURM requeues it.
    sweep_dir = tmp_path / "sweep"
    tiny = [o for o in TINY if not o.startswith("logger=")]
    few = ["trainer.eval_max_examples=8", "trainer.test_max_examples=8"]
    proc = start_sweep({**slurm_env, **online.env()}, tmp_path, *tiny, *EXACT, *few, *WANDB, "logger.project=requeued",
                       *LAUNCHER, f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    run_dir = wait_for("a logged training loss", lambda: job_dir(sweep_dir), proc)
    job_id = json.loads((run_dir / "status.json").read_text())["slurm"]["job_id"]
    requeue = lambda: subprocess.run(["scontrol", "requeue", job_id], env={**os.environ, **slurm_env}, check=True)  # noqa: E731
    hold_until_signalled(wait_for("the job's process", lambda: job_pid(sweep_dir), proc), signal.SIGTERM, proc, requeue)
    out, err = finish(proc, tmp_path)
    assert proc.returncode == 0 and f"slurm {job_id} requeued 1x" in out, err[-3000:]
    (run,) = online.runs("requeued")
    status = json.loads((run_dir / "status.json").read_text())
    assert run["run_id"] == status["wandb_id"] and status["slurm"]["restarts"] == 1
    assert run["state"] == "finished" and run["summary"]["run/state"] == "finished"
    # SLURM's SIGTERM stopped wandb's service process too (wandb/wandb#9963): the first attempt said so and went on
    # to its checkpoint without wandb, and the server lacks the rows the service had not sent; the requeued attempt
    # sent every one of its own. No step twice (server.history checks), and every value the server has is local's.
    log = "".join(p.read_text() for p in sorted(sweep_dir.glob(".submitit/*/*_log.*")))
    stopped = int(log.split("normlab: stopped by SIGTERM after step ")[1].split(";")[0])
    assert "normlab: wandb's service process is gone (ConnectionResetError" in log
    history, local = online.history(run["run_id"]), logged(run_dir)
    assert set(range(stopped + 1, 13)) <= set(history["train/loss"]) and max(history["train/loss"]) == 12
    for key, by_step in history.items():
        assert key == "trainer/step" or by_step == pytest.approx({s: local[key][s] for s in by_step}, rel=1e-12, abs=0)


def sent_group(run_dir: Path) -> str:
    """The wandb group the run sent, from its local transaction log (``wandb/run-*/run-*.wandb``)."""
    (log,) = run_dir.glob("wandb/run-*/run-*.wandb")
    (run,) = [r.run for r in wandb_records(log) if r.HasField("run")]
    return run.run_group


def test_wandb_workspace_says_in_one_line_that_the_server_keeps_no_workspaces(
    online: WandbServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts.wandb_workspace import main

    layers = ["--n-enc-layers", "2", "--n-dec-layers", "2"]
    assert main(["--entity", "default", "--project", "ws", "--group", "g", *layers]) == 0  # the outline: no server
    assert "Gradient norm per block (4)" in capsys.readouterr().out
    assert main(["--entity", "default", "--project", "ws", "--group", "g", *layers, "--save"]) == 1
    error = capsys.readouterr().err
    hint = "(workspaces need W&B's cloud or W&B Server)"
    assert error.startswith(f"wandb_workspace: error: saving to {online.url} failed {hint}: ") and error.count("\n") == 1


# The train group's "loss" chart of openwandb's run page (its charts are grouped under a header per prefix), once drawn.
TRAIN_LOSS_CHART = (
    "[...document.querySelectorAll('.chart-box')].find(b => b.querySelector('h4')?.textContent === 'loss'"
    " && b.parentElement.previousElementSibling?.textContent === 'train' && b.querySelector('canvas'))"
)


@pytest.mark.browser
def test_the_servers_run_page_draws_the_loss_chart(online: WandbServer, tmp_path: Path) -> None:
    from matplotlib.image import imread

    binary = chromium()
    if binary is None:
        pytest.skip("chromium not found: apt-get install chromium")
    train_module.train(make_cfg(*WANDB, "logger.project=page"), tmp_path / "run")
    (run,) = online.runs("page")
    online.make_public("page")  # the page without a login
    png = tmp_path / "loss.png"
    shoot_element(binary, f"{online.url}/runs/default/page/{run['run_id']}", TRAIN_LOSS_CHART, png, tmp_path / "profile")
    pixels = imread(png)[..., :3]  # (H, W, 3) in [0, 1]: the chart alone
    # The loss line: saturated pixels (max - min channel > 0.4; the page's greys, navy and the area under the line have
    # less), a few hundred at least for 20 steps drawn across the chart.
    line = int(((pixels.max(axis=-1) - pixels.min(axis=-1)) > 0.4).sum())
    assert pixels.shape[0] > 150 and pixels.shape[1] > 250 and line > 300, (pixels.shape, line)
