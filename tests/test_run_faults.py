"""A run dir under bad input and faults: each case stops with one line that names
what is wrong, or recovers, and a run dir that is refused stays as it was."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train as train_module
from tests.helpers.config import ROOT, make_cfg
from tests.helpers.resume import stop_by_sigterm
from training.checkpoint import load_checkpoint
from training.schema import validate

CLI = ["model=tiny", "trainer=smoke", "logger=none", "telemetry.every=5"]  # make_cfg's settings, on the command line

# Run as `python -c SIGTERM_IN_TEST <overrides>`: train.py, with a SIGTERM landing while the final test decodes.
SIGTERM_IN_TEST = f"""
import os, runpy, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from training.tasks import g2p
evaluate = g2p.G2PTask.evaluate
def sigterm_in_test(self, model, split, *args):
    if split == "test":
        os.kill(os.getpid(), signal.SIGTERM)
    return evaluate(self, model, split, *args)
g2p.G2PTask.evaluate = sigterm_in_test
sys.argv = [{str(ROOT / "train.py")!r}, *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

G2P_TEST = {"test/per", "test/wer", "test/per_1ref", "test/wer_1ref"}  # every score of the final test


def train_cli(*args: str, cwd: Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of ``run_dir`` (relative path -> bytes)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def test_an_empty_cache_dir_stops_naming_the_key_and_writes_nothing(tmp_path):  # 1
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = train_cli(str(ROOT / "train.py"), *CLI, "data.cache_dir=''", f"hydra.run.dir={tmp_path / 'run'}", cwd=cwd)
    message = ("normlab: error: data.cache_dir='' is empty; give a directory (default ~/.cache/normlab/cmudict), or "
               "null to parse and encode in every process\n")  # fmt: skip
    assert (proc.returncode, proc.stderr) == (1, message)
    assert list(cwd.iterdir()) == []  # no cache entry in the current directory
    translation = "data.cache_dir=' ' is empty; give a directory (default ~/.cache/normlab/bpe)"  # no null there
    with pytest.raises(ValueError, match=re.escape(translation)):
        validate(make_cfg("data=multi30k", "data.cache_dir=' '"))


def test_a_refused_resume_leaves_the_run_dir_as_it_was(tmp_path, monkeypatch):  # 15
    stop_by_sigterm(monkeypatch, make_cfg("trainer.max_steps=12"), tmp_path, 5)
    before = snapshot(tmp_path)
    assert status(tmp_path)["state"] == "interrupted" and "checkpoint.pt" in before
    refused = "was trained with another model .*norm.kind: checkpoint 'layernorm', this run 'rmsnorm'"
    with pytest.raises(ValueError, match=refused):
        train_module.train(make_cfg("trainer.max_steps=12", "norm=pre_rms"), tmp_path)
    assert snapshot(tmp_path) == before  # config.yaml, status, metrics, checkpoints, vocabularies


def test_a_finished_run_dir_rerun_with_another_norm_is_refused_and_another_setting_named(tmp_path, capsys):  # 16
    train_module.train(make_cfg("trainer.max_steps=5"), tmp_path)
    before = snapshot(tmp_path)
    pattern = (
        re.escape(f"{tmp_path} holds a finished run of another model (")
        + ".*norm.kind: finished run 'layernorm', this run 'rmsnorm'"
    )
    with pytest.raises(ValueError, match=pattern):
        train_module.train(make_cfg("trainer.max_steps=5", "norm=pre_rms"), tmp_path)
    assert snapshot(tmp_path) == before
    capsys.readouterr()
    train_module.train(make_cfg("trainer.max_steps=5", "trainer.test_max_examples=7"), tmp_path)  # not the model's
    assert capsys.readouterr().out == (
        f"normlab: {tmp_path} already finished at step 5; skipped (train.resume=null reruns it); this run's settings "
        "differ from it: trainer.test_max_examples: finished run 200, this run 7\n"
    )
    assert snapshot(tmp_path) == before


def test_a_resume_drops_a_torn_last_metrics_line_and_names_a_corrupt_one(tmp_path, capsys):  # 17
    train_module.train(make_cfg("trainer.max_steps=5"), tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    n = len(metrics.read_text().splitlines())
    with metrics.open("a") as f:
        f.write('{"step": 5, "train/lo')  # a kill in the middle of writing a row
    train_module.train(make_cfg("trainer.max_steps=8"), tmp_path)
    dropped = f"normlab: {metrics}: dropped its last line (line {n + 1}), cut short by a run killed mid-write\n"
    assert dropped in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 8 and status(tmp_path)["state"] == "finished"
    lines = metrics.read_text().splitlines(keepends=True)
    lines[2] = lines[2][:12] + "\n"  # not the last line: not what a kill leaves
    metrics.write_text("".join(lines))
    with pytest.raises(ValueError, match=f"^{re.escape(str(metrics))} line 3 is not a metrics row \\(JSONDecodeError: "):
        train_module.train(make_cfg("trainer.max_steps=10"), tmp_path)


def test_sigterm_during_the_final_test_stops_it_and_a_resume_tests_again(tmp_path):  # 18
    run_dir = tmp_path / "run"
    proc = train_cli("-c", SIGTERM_IN_TEST, *CLI, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    checkpoint = run_dir / "checkpoint.pt"
    expected = f"normlab: stopped by SIGTERM during the final test; checkpoint {checkpoint} (step 20); continue with:"
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    st = status(run_dir)
    assert st["state"] == "interrupted" and "during the final test" in st["error"] and "test" not in st
    test = train_module.train(make_cfg(), run_dir)  # train.resume=auto: no step left to train, the test again
    assert status(run_dir)["state"] == "finished" and status(run_dir)["test"] == test and set(test) == G2P_TEST
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "test/per" in r] == [20]


def test_a_signal_during_the_last_step_s_validation_is_not_lost(tmp_path, monkeypatch):
    # the loop reads the signal before the last step's validation and checkpoint; one landing there was dropped and
    # the run went on to its test and exit 0
    import training.run

    real = training.run.validate_run

    def sigterm_in_last_validation(run):
        if run.step == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(run)

    monkeypatch.setattr(training.run, "validate_run", sigterm_in_last_validation)
    with pytest.raises(train_module.RunInterrupted, match="stopped by SIGTERM after the last step, before the final test"):
        train_module.train(make_cfg("trainer.max_steps=4"), tmp_path)
    assert status(tmp_path)["state"] == "interrupted" and "test" not in status(tmp_path)
    monkeypatch.setattr(training.run, "validate_run", real)
    train_module.train(make_cfg("trainer.max_steps=4"), tmp_path)  # resumes at step 4: the test alone
    assert status(tmp_path)["state"] == "finished" and set(status(tmp_path)["test"]) == G2P_TEST


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="root writes anywhere; setpriv drops that")
def test_a_read_only_run_dir_stops_with_one_normlab_line(tmp_path):  # 19
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o555)
    # root writes into a read-only dir: it runs train.py without the capabilities that let it
    prefix = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search") if os.geteuid() == 0 else ()
    try:
        proc = train_cli(str(ROOT / "train.py"), *CLI, f"hydra.run.dir={run_dir}", cwd=tmp_path, prefix=prefix)
    finally:
        run_dir.chmod(0o755)
    message = f"normlab: error: cannot write into run dir '{run_dir}': Permission denied; make it writable or give another "
    message += "hydra.run.dir\n"
    assert (proc.returncode, proc.stderr) == (1, message)
    assert list(run_dir.iterdir()) == []


def test_a_second_run_on_a_busy_run_dir_stops_at_once_and_a_killed_holder_blocks_nothing(tmp_path):  # 20
    run_dir = tmp_path / "run"
    holding = [*CLI, "trainer.max_steps=100000", "trainer.checkpoint_every=2", f"hydra.run.dir={run_dir}"]
    holder = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *holding], cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoint.pt").exists():
            assert time.monotonic() < deadline and holder.poll() is None, holder.communicate()
            time.sleep(0.2)
        second = [*CLI, "seed=1", "trainer.max_steps=6", "train.resume=null", f"hydra.run.dir={run_dir}"]  # a fresh start
        second = train_cli(str(ROOT / "train.py"), *second, cwd=tmp_path)
        assert second.returncode == 1 and second.stderr.startswith(
            f"normlab: error: run dir {run_dir} is in use by another run (pid {holder.pid} on "
        ), second.stderr
        assert second.stderr.count("\n") == 1
        assert "seed: 0" in (run_dir / "config.yaml").read_text()  # the holder's config, untouched
    finally:
        holder.kill()  # SIGKILL: no handler runs, the lock goes with the process
        holder.communicate()
    # the resume continues from checkpoint.pt, which a SIGKILL can leave a step ahead of status.json
    step = load_checkpoint(run_dir / "checkpoint.pt")["step"]
    train_module.train(make_cfg(f"trainer.max_steps={step + 2}", "trainer.checkpoint_every=2"), run_dir)
    assert status(run_dir)["state"] == "finished" and status(run_dir)["step"] == step + 2
