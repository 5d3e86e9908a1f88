"""torchrun across nodes: 2 "nodes" of 1 process each (two torchrun agents meeting at a c10d rendezvous on
localhost, one filesystem), preempted and resumed, train exactly as one process with twice the batch; rank 0
alone writes into the one run dir; a resume in which the ranks find different checkpoints is refused."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import train as train_module
from runlog.status import read_status
from tests.helpers.config import ROOT, make_cfg
from tests.helpers.distributed import DEFAULTS, ENV, assert_trains_as_one_process, free_port
from training import distributed
from training.checkpoint import load_checkpoint
from training.distributed import RankZeroHydraFiles

# Run as `torchrun ... writes.py <overrides>` in the test's dir: each rank appends to rank<RANK>.jsonl its
# torchrun variables, then every file it creates, writes, renames or removes under outputs/ (Python's audit
# events: writes from native code, such as the tokenizers library saving the vocabularies, are not seen; creating a
# directory that may exist already is not counted).
RECORD_WRITES = f"""
import json, os, runpy, sys
sys.path.insert(0, {str(ROOT)!r})
OUTPUTS = os.path.realpath("outputs")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
log = open("rank" + os.environ["RANK"] + ".jsonl", "a")
log.write(json.dumps({{k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")}}) + "\\n")
log.flush()
def hook(event, args):
    if event == "open":
        path, mode, flags = args
        if not (set(mode) & set("wax+") if isinstance(mode, str) else flags & WRITE_FLAGS):
            return
    elif event in ("os.rename", "os.remove", "os.truncate", "os.rmdir"):
        path = args[1] if event == "os.rename" else args[0]  # a rename: the name it gives
    else:
        return
    real = os.path.realpath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
    if real.startswith(OUTPUTS + os.sep):
        log.write(json.dumps([event, os.path.relpath(real, OUTPUTS)]) + "\\n")
        log.flush()
sys.addaudithook(hook)
runpy.run_path({str(ROOT / "train.py")!r}, run_name="__main__")
"""


@pytest.fixture
def launch(tmp_path):
    """``launch(args, attempt)``: two torchrun agents, one process each, meeting at a c10d rendezvous on localhost
    (what `torchrun --nnodes=2` on two hosts does; the rendezvous numbers the nodes in the order they arrive),
    training ``writes.py args`` in ``tmp_path``; their output goes to ``<attempt><0|1>.out|err``. Agents and
    workers still running at the end of the test are killed."""
    (tmp_path / "writes.py").write_text(RECORD_WRITES)
    started = []

    def two_nodes(args: list[str], attempt: str) -> list[subprocess.Popen]:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
               f"--rdzv_endpoint=localhost:{free_port()}", f"--rdzv_id={uuid.uuid4().hex}", "writes.py", *args]  # fmt: skip
        for n in (0, 1):
            with (tmp_path / f"{attempt}{n}.out").open("w") as out, (tmp_path / f"{attempt}{n}.err").open("w") as err:
                agent = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=out, stderr=err, start_new_session=True)
                started.append(agent)
        return started[-2:]

    yield two_nodes
    for agent in started:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def finish(agents: list[subprocess.Popen], cwd: Path, attempt: str) -> tuple[list[int], str, str]:
    """Each agent's exit status (after at most 300 s), and all their stdout and stderr."""
    codes = [agent.wait(timeout=300) for agent in agents]
    read = lambda ext: "".join((cwd / f"{attempt}{n}.{ext}").read_text() for n in (0, 1))  # noqa: E731
    return codes, read("out"), read("err")


@pytest.mark.dist
def test_two_nodes_preempted_and_resumed_train_exactly_as_one_process_with_twice_the_batch(tmp_path, launch):
    agents = launch(DEFAULTS, "first")
    deadline = time.monotonic() + 300
    while not (metrics := list(tmp_path.glob("outputs/*/*/metrics.jsonl"))) or '{"step": 1,' not in metrics[0].read_text():
        assert time.monotonic() < deadline and all(a.poll() is None for a in agents), "the two nodes never reached step 1"
        time.sleep(0.05)
    for agent in agents:  # a preempted job: SIGTERM to each node's agent, which hands it to its worker
        agent.send_signal(signal.SIGTERM)
    codes, _, err = finish(agents, tmp_path, "first")
    assert all(code != 0 for code in codes)
    stopped = re.findall(r"normlab: stopped by SIGTERM after step (\d+)", err)
    assert len(stopped) == 2 and len(set(stopped)) == 1 and int(stopped[0]) in (5, 10, 15), err[-3000:]
    step = int(stopped[0])  # both ranks, at one logging step, whichever step each got the signal in
    (run_dir,) = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]  # rank 0's start time names it
    assert run_dir.name.endswith("_pre-layernorm-custom") and load_checkpoint(run_dir / "checkpoint.pt")["step"] == step

    codes, out, err = finish(launch([*DEFAULTS, f"hydra.run.dir={run_dir}"], "second"), tmp_path, "second")
    assert codes == [0, 0], err[-3000:]
    assert out.count(f"normlab: resuming from step {step}") == 2 and out.count("test PER") == 1  # rank 0's summary

    assert_trains_as_one_process(run_dir, tmp_path, DEFAULTS, [1, 5, 10, 15, 20])

    records = {r: [json.loads(line) for line in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    for r, rows in records.items():
        env = [row for row in rows if isinstance(row, dict)]
        # two nodes in each attempt: every process is local rank 0 of a node of one process, its node rank its rank
        assert env == [{"RANK": str(r), "LOCAL_RANK": "0", "GROUP_RANK": str(r), "LOCAL_WORLD_SIZE": "1"}] * 2
    assert [row for row in records[1] if isinstance(row, list)] == []  # rank 1 wrote no file into the run dir
    in_run_dir = run_dir.relative_to(tmp_path / "outputs")
    written = {Path(row[1]).relative_to(in_run_dir).as_posix() for row in records[0] if isinstance(row, list)}
    assert {"train.log", ".hydra/config.yaml", "metrics.jsonl", "checkpoint.pt", "status.json"} <= written


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_keeps_hydra_s_files_and_every_rank_its_console_log(monkeypatch, rank):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+hydra.job_logging.loggers.data.handlers=[file,console]"], return_hydra_config=True)
    default = OmegaConf.to_container(cfg.hydra.job_logging)
    monkeypatch.setattr(distributed, "rank", lambda: rank)
    RankZeroHydraFiles().on_run_start(cfg)
    logging = OmegaConf.to_container(cfg.hydra.job_logging)
    if rank == 0:
        assert cfg.hydra.output_subdir == ".hydra" and logging == default
    else:  # no .hydra/, no train.log: the file handler is gone wherever it was named
        assert cfg.hydra.output_subdir is None and set(logging["handlers"]) == {"console"}
        assert logging["root"]["handlers"] == logging["loggers"]["data"]["handlers"] == ["console"]
        assert logging["handlers"]["console"] == default["handlers"]["console"]


def test_a_resume_in_which_the_ranks_find_different_checkpoints_stops_before_training(tmp_path, monkeypatch):
    # This process is rank 0 and finds no checkpoint; a rank 1 on a node that sees an old copy of the run dir finds
    # one of step 5 (every rank reads the checkpoint itself: training/run.py start_run).
    monkeypatch.setattr(distributed, "all_gather_object", lambda obj: [obj, "step 5"])
    with pytest.raises(ValueError) as e:
        train_module.train(make_cfg(), tmp_path)
    message = (f"train.resume: the checkpoint found differs between ranks (rank 0: none, rank 1: step 5); the run dir "
               f"{tmp_path} must be on a filesystem that every node sees")  # fmt: skip
    assert str(e.value) == message
    assert read_status(tmp_path)["state"] == "failed" and not (tmp_path / "metrics.jsonl").exists()  # nothing trained
