"""The command line around Hydra (training/cli.py): argument checks before Hydra, a run dir that cannot be
created, printed resume commands that paste as they are, and Ctrl-C during start-up (issues 20 and 21)."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

import train as train_module
from model.norms import NORM_KINDS
from tests.helpers.config import ROOT
from training.checkpoint import LATEST
from training.cli import check_args, command, presets, sweep_preset_warning

SMOKE = ["model=tiny", "trainer=smoke", "logger=none"]


def train_py(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.mark.parametrize("multirun", [False, True], ids=["run", "multirun"])
@pytest.mark.parametrize("where", ["proc", "under_a_file"])
def test_a_run_dir_that_cannot_be_created_is_one_line_naming_it_and_why(tmp_path, where, multirun):
    (tmp_path / "afile").write_text("")
    cases = {"proc": ("/proc/x", "No such file or directory"), "under_a_file": (tmp_path / "afile" / "run", "Not a directory")}
    bad, reason = cases[where]
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    done = train_py(*(["-m"] if multirun else []), *SMOKE, f"{key}={bad}", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == f"normlab: error: cannot create run dir '{bad}': {reason}"


@pytest.mark.parametrize("kind", NORM_KINDS)
def test_a_norm_kind_given_as_norm_names_norm_kind_and_the_presets(kind, capsys):
    with pytest.raises(SystemExit) as stop:
        check_args(["model=tiny", f"norm={kind}"])
    assert stop.value.code == (
        f"normlab: error: norm={kind} is not a preset; did you mean norm.kind={kind} (the norm kind, on the default "
        f"placement) or a preset such as norm=pre_ln? presets: {', '.join(presets('norm'))}"
    )
    check_args(["norm=pre_ln", f"norm.kind={kind}"])  # the axis itself, and a preset, pass
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["norm=pre_lm"], "unknown norm preset 'pre_lm'; did you mean norm=pre_ln or norm=pre_rms or norm=pre_lns? valid: "),
        (["-m", "norm=post_ln,pre_lm", "seed=0,1"], "unknown norm preset 'pre_lm'; did you mean norm=pre_ln"),
        (["model=tinyy"], "unknown model preset 'tinyy'; did you mean model=tiny? valid: base, mini, small, tiny"),
        (
            ["model.d_modle=64"],
            "model.d_modle is not a key of model; did you mean model.d_model or model.base_d_model? valid keys: d_model, n_heads",
        ),
        (["-m", "norm=post_ln,pre_ln", "seed=0,1", "model.d_modle=64"], "model.d_modle is not a key of model; did you mean"),
        (["+experiment=norm_ablation", "trainer.max_step=3"], "trainer.max_step is not a key of trainer; did you mean "
                                                              "trainer.max_steps or trainer.max_tokens?"),
        (["data=multi30k", "data.maxlen=3"], "data.maxlen is not a key of data; did you mean data.max_len?"),  # the preset's keys
        (["norm.knobs.powernorm.warmup=3"], "norm.knobs.powernorm.warmup is not a key of norm.knobs.powernorm; did you mean "
                                            "norm.knobs.powernorm.warmup_iters?"),
        (["logger=none", "logger.project=x"], "logger.project is not a key of logger; valid keys: name"),
    ],
)  # fmt: skip
def test_an_unknown_preset_or_key_is_one_line_naming_the_nearest(args, error):
    with pytest.raises(SystemExit) as stop:
        check_args(args)
    assert str(stop.value.code).startswith(f"normlab: error: {error}") and "\n" not in str(stop.value.code)


def test_docs_config_quotes_the_errors_the_command_line_check_prints():
    # docs/config.md: `<override>` -> `normlab: error: <message>...` (a message cut short ends with "...").
    text = " ".join((ROOT / "docs" / "config.md").read_text().split())
    quoted = re.findall(r"`([^`]+)` -> `normlab: error: ([^`]+)`", text)
    checked = 0
    for override, message in quoted:
        try:
            check_args([override])
        except SystemExit as stop:
            assert str(stop.code).startswith("normlab: error: " + message.removesuffix("...")), override
            checked += 1
    assert checked >= 3  # norm=layernorm, model.d_modle=64, norm=pre_lm


@pytest.mark.parametrize(
    "args",
    [
        ["data=multi30k", "data.max_len=3"],  # a key the preset brings
        ["-m", "+experiment=norm_ablation", "trainer.max_steps=3"],
        ["-m", "norm=glob(pre_*)", "norm.kind=rmsnorm"],  # Hydra's sweep functions are Hydra's to read
        ["hydra/launcher=joblib", "-m", "seed=0,1"],  # Hydra's own presets live outside conf/
        ["+norm.new_key=1", "hydra.run.dir=/tmp/x", "norm.blocks=[{stack: enc, kind: rmsnorm}]"],
        ["norm.knobs.powernorm.warmup_iters=3", "optim.betas=[0.9,0.95]"],
    ],
)
def test_valid_presets_and_keys_pass_the_check(args, capsys):
    check_args(args)
    assert capsys.readouterr() == ("", "")


def test_cli_norm_layernorm_exits_1_with_one_line_before_hydra_runs(tmp_path):
    done = train_py(*SMOKE, "norm=layernorm", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().startswith("normlab: error: norm=layernorm is not a preset; did you mean norm.kind=layernorm")
    assert "\n" not in done.stderr.strip() and not (tmp_path / "outputs").exists()


def test_a_sweep_preset_without_multirun_warns_that_one_run_trains(capsys):
    warning = sweep_preset_warning(["+experiment=norm_ablation", "model=tiny"])
    assert warning == (
        "+experiment=norm_ablation is a sweep preset; without -m only one run (its base config) trains: add -m to run the sweep"
    )
    check_args(["+experiment=norm_ablation"])
    assert capsys.readouterr().err == f"normlab: warning: {warning}\n"
    assert sweep_preset_warning(["-m", "+experiment=norm_ablation"]) is None
    assert sweep_preset_warning(["+experiment=norm_ablation", "hydra.run.dir=multirun/x/norm=pre_ln,seed=0"]) is None  # one job
    assert sweep_preset_warning(["+experiment=iwslt_de_en"]) is None  # a recipe, not a sweep


@pytest.fixture(scope="module")
def help_text() -> str:
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_names_normlab_the_norm_axes_the_presets_and_the_docs(help_text):
    assert help_text.startswith("normlab: an encoder-decoder Transformer lab")
    kinds = re.search(r"norm\.kind \(([^)]*)\)", help_text).group(1)
    assert kinds.split(", ") == list(NORM_KINDS)
    assert "A preset\n(norm=pre_ln, the default) sets all of them at once" in help_text
    (norm,) = [line for line in help_text.splitlines() if line.startswith("norm: ")]  # Hydra's group listing stays
    assert norm.removeprefix("norm: ").split(", ") == presets("norm")
    for doc in ("README.md", "docs/config.md", "docs/norms.md", "docs/sweeps.md"):
        assert doc in help_text and (ROOT / doc).is_file()
    assert "Powered by Hydra" not in help_text


@pytest.mark.parametrize("run_dir", ["/tmp/s/norm=post_ln,seed=1", "/tmp/a b/it's", "/tmp/x[1]/{y}:z", "outputs/plain-dir_1.2"])
def test_a_printed_command_gives_hydra_the_run_dir_unchanged(run_dir):
    line = command(["norm=post_ln", "seed=0,1"], "hydra.sweep.dir", run_dir)
    words = shlex.split(line)
    assert words[:5] == ["python", "train.py", "-m", "norm=post_ln", "seed=0,1"]
    (override,) = OverridesParser.create().parse_overrides(words[5:])
    assert override.key_or_group == "hydra.sweep.dir" and override.value() == run_dir


def test_the_printed_resume_command_of_a_sweep_job_pastes_and_resumes_it(tmp_path):
    # the job's run dir holds "=" and ","; the command once failed in Hydra's parser.
    sweep_dir = tmp_path / "s"
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", *SMOKE, "trainer.max_steps=60",
           f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ((m := next(sweep_dir.glob("*/metrics.jsonl"), None)) and '"train/loss"' in m.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    job_dir = m.parent
    assert "=" in job_dir.name and "," in job_dir.name
    (line,) = [line for line in stderr.splitlines() if line.startswith("normlab: stopped by SIGTERM after step")]
    job_cmd, sweep_cmd = re.fullmatch(r".*; continue with: (.*); the whole sweep: (.*)", line).groups()
    assert job_cmd.endswith(f"\"hydra.run.dir='{job_dir}'\"")
    overrides = " ".join([*SMOKE, "trainer.max_steps=60"])
    assert sweep_cmd == f"python train.py -m {overrides} hydra.sweep.dir={sweep_dir}"
    status = json.loads((job_dir / "status.json").read_text())
    assert status["state"] == "interrupted" and status["error"] == f"RunInterrupted: {line.removeprefix('normlab: ')}"

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    resumed = subprocess.run(["bash", "-c", job_cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"normlab: resuming from step {status['step']} (checkpoint {job_dir / LATEST})\n" in resumed.stdout
    assert json.loads((job_dir / "status.json").read_text())["state"] == "finished"
    again = subprocess.run(["bash", "-c", sweep_cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished at step 60; skipped" in again.stdout and "1 job: 1 finished" in again.stdout


def _train_stopped_in_start_up(run_dir: Path, patch: str) -> None:
    """Run train.py as its own __main__ (Hydra finds conf/ beside it) after ``patch`` (Python lines that put a Ctrl-C
    into its start-up), SIGINT as a terminal delivers it; assert the one line and exit 130 a start-up Ctrl-C ends in."""
    argv = f"sys.argv = ['train.py', *{SMOKE!r}, 'hydra.run.dir={run_dir}']\n"
    script = f"import runpy, signal, sys\n{patch}{argv}runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert done.returncode == 128 + signal.SIGINT and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert [line for line in done.stderr.splitlines() if line.startswith("normlab:")] == [
        f"normlab: stopped by SIGINT; nothing to resume (no checkpoint yet); rerun with: python train.py {' '.join(SMOKE)} "
        f"hydra.run.dir={run_dir}"
    ]


def test_ctrl_c_before_the_run_dir_is_held_is_one_line_and_exits_130(tmp_path):
    # The test below sends SIGINT once Hydra has written the job's overrides; on a loaded machine it landed before
    # train()'s handler (in distributed.rank(), in sweep_stop_file()) and printed a traceback. Here it lands there,
    # as train() takes its run dir's lock.
    patch = "import runlog.lock\ndef ctrl_c(run_dir): raise KeyboardInterrupt\nrunlog.lock.run_dir_lock = ctrl_c\n"
    _train_stopped_in_start_up(tmp_path / "run", patch)


@pytest.mark.parametrize("turned_into", [None, "TypeError"])
def test_a_ctrl_c_during_the_set_up_is_one_line_and_exits_130(tmp_path, turned_into):
    # A SIGINT before the loop once printed a KeyboardInterrupt traceback and no resume line. And in CI one landed
    # while CPython 3.11 built the ImportError of mpmath's ``from itertools import izip`` (torch imports it at
    # start-up): the KeyboardInterrupt became ``TypeError: expected a message argument``, a traceback and exit 1.
    # Here the Ctrl-C comes as the run is set up, as it is or turned into that error.
    turn = f"raise {turned_into}('expected a message argument') from None" if turned_into else "raise"
    patch = (
        "import training.run\n"
        "def start_run(*args):\n"
        "    try:\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "    except KeyboardInterrupt:\n"
        f"        {turn}\n"
        "training.run.start_run = start_run\n"
    )
    _train_stopped_in_start_up(tmp_path / "run", patch)
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "interrupted"


def test_a_terminal_s_ctrl_c_anywhere_in_the_start_is_one_line_and_exits_130(tmp_path):
    # A real SIGINT once Hydra has written the job's overrides lands where the machine's load puts it: in Hydra's own
    # start-up, before the run dir is held, in the set-up or in the first steps (the tests above pin each window and
    # its exact line). Wherever it lands: one normlab line, no traceback, exit 130, and no run left "running".
    run_dir = tmp_path / "run"
    # SIGINT as a terminal delivers it: a suite started in the background (``cmd &`` in a script) passes SIGINT
    # on ignored, and a Python started with it ignored never turns it into KeyboardInterrupt.
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *SMOKE, f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 300
    while not (run_dir / ".hydra" / "overrides.yaml").exists():  # written by Hydra just before it calls the job
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT and "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("normlab:")]
    assert len(lines) == 1 and lines[0].startswith("normlab: stopped by SIGINT"), stderr[-3000:]
    assert "rerun" in lines[0] or "continue with: " in lines[0], lines[0]
    if (run_dir / "status.json").exists():
        assert json.loads((run_dir / "status.json").read_text())["state"] == "interrupted"


def test_the_resume_hint_names_the_checkpoint_when_there_is_one(tmp_path):
    (tmp_path / LATEST).write_bytes(b"")
    (tmp_path / "status.json").write_text(json.dumps({"state": "running", "step": 10}))
    assert train_module.resume_hint(tmp_path) == (
        f"checkpoint {tmp_path / LATEST} (step 10); continue with: python train.py hydra.run.dir={tmp_path}"
    )


def test_each_norm_preset_names_its_run_dir_and_start_line_apart():
    from omegaconf import OmegaConf

    from model.norm_config import norm_label, norm_title
    from tests.helpers.config import compose_conf

    labels = {}
    for name in presets("norm"):
        norm = OmegaConf.to_container(compose_conf(f"norm={name}").norm, resolve=False)
        labels.setdefault("-".join(norm_label(norm)), []).append(name)
    assert [names for names in labels.values() if len(names) > 1] == []
    assert labels["pre-layernorm-custom-gpas"] == ["pre_ln_gpas"] and labels["pre-dyt-custom"] == ["pre_dyt"]
    assert "pre-layernorm-custom" in labels and "pre-layernorm-custom-enc_powernorm" in labels  # pre_ln, pre_pn
    assert norm_title(OmegaConf.to_container(compose_conf("norm=pre_ln_mhc").norm)) == "pre/layernorm/custom + hc_mhc"
