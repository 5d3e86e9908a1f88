"""scripts/predict.py (run as ``python -m scripts.predict``) on a G2P checkpoint, the decode keys' checks and the IWSLT preset."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import train as train_module
from runlog.tasks import TASKS
from scripts.predict import main as predict_main
from tests.helpers.config import ROOT, make_cfg, model_config
from training.devices import device_choices, parse_device
from training.evaluate import DecodeConfig
from training.predict import describe, load_model, predict


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A G2P run of 10 steps (model.max_len 64), shared by the tests, which write nothing into it."""
    path = tmp_path_factory.mktemp("g2p_run")
    train_module.train(make_cfg("trainer.max_steps=10", "telemetry.every=0"), path)
    return path


def test_predict_spells_words_with_a_g2p_checkpoint(run_dir, tmp_path):
    model, src, tgt, task = load_model(str(run_dir / "checkpoint.pt"), device=None)
    assert task.name == "g2p"
    for beam in (1, 3):
        out = predict(["Cat", "", "phoneme"], model, src, tgt, task, DecodeConfig(beam_size=beam), 1024, device=None)
        assert len(out) == 3 and out[1] == "" and set(" ".join(out).split()) <= set(tgt.get_vocab())  # phonemes
    assert predict(["cat"], model, src, tgt, task, DecodeConfig(beam_size=1), 1024, device=None)[0]  # untrained: babble
    (tmp_path / "words.txt").write_text("cat\nhello\n")
    proc = subprocess.run([sys.executable, "-m", "scripts.predict", str(run_dir / "checkpoint.pt"),
                           str(tmp_path / "words.txt"), "--beam-size", "1"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "scripts.predict", str(tmp_path / "nope.pt")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.startswith("predict: error: no checkpoint file at")


def test_predict_takes_a_run_dir_and_says_what_it_read(run_dir, tmp_path):
    (tmp_path / "words.txt").write_text(f"abc123\nHello\nnew york\n{'a' * 60}xyzw\n")
    words = str(tmp_path / "words.txt")
    proc = subprocess.run([sys.executable, "-m", "scripts.predict", str(run_dir), words, "--beam-size=1"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 4  # one prediction per word, on stdout alone
    test = json.loads((run_dir / "status.json").read_text())["test"]
    assert proc.stderr.splitlines() == [
        f"predict: {run_dir / 'checkpoint.pt'} at step 10 of 10; test PER {test['test/per']:.2%}, WER {test['test/wer']:.2%}, "
        f"1-ref PER {test['test/per_1ref']:.2%}, 1-ref WER {test['test/wer_1ref']:.2%}",
        "predict: line 1 'abc123': not in the vocabulary, read as <unk>: '1' '2' '3'",  # digits: no CMUdict letters
        "predict: line 3 'new york': not in the vocabulary, read as <unk>: ' '",
        "predict: line 4: longer than 63 tokens (model.max_len - 1); dropped: 'w'",
    ]


def test_the_first_line_names_an_average_and_the_weights_the_run_tested(tmp_path):
    text = "average of the last 3 checkpoints, steps 8-12"  # trainer.average_last=3 (training/average.py)
    test = {"test/per": 0.1, "test/wer": 0.3}
    (tmp_path / "status.json").write_text(json.dumps({"step": 12, "max_steps": 12, "test": test, "tested": text}))
    averaged, last = tmp_path / "averaged.pt", tmp_path / "checkpoint.pt"
    assert describe({"step": 12, "average": text}, averaged, TASKS["g2p"]) == (
        f"predict: {averaged} ({text}) at step 12 of 12; test PER 10.00%, WER 30.00%")  # fmt: skip
    assert describe({"step": 12}, last, TASKS["g2p"]) == (
        f"predict: {last} at step 12 of 12; test PER 10.00%, WER 30.00% (tested: {text})")  # fmt: skip


@pytest.mark.parametrize("device", ["tpu", "cuda:99"])
def test_a_device_not_of_this_machine_is_one_line_naming_the_flag_and_the_choices(run_dir, tmp_path, device):
    (tmp_path / "words.txt").write_text("cat\n")
    with pytest.raises(SystemExit) as stop:
        predict_main([str(run_dir), str(tmp_path / "words.txt"), "--device", device])
    valid = ", ".join(device_choices())  # cpu here; cpu, cuda, cuda:0, ... on a machine with CUDA
    assert stop.value.code == f"predict: error: --device {device!r} is not a device of this machine; valid: {valid}"


def test_the_device_choices_are_this_machines_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert device_choices() == ["cpu", "cuda", "cuda:0", "cuda:1"]
    assert parse_device("cuda:1") == torch.device("cuda", 1) and parse_device("cpu:0") == torch.device("cpu", 0)
    with pytest.raises(ValueError, match=r"^--device 'cuda:2' is not a device of this machine; valid: cpu, cuda, cuda:0, "
                                         r"cuda:1$"):  # fmt: skip
        parse_device("cuda:2")
    with pytest.raises(ValueError, match=r"^--gpu 'cuda:x' is not a device"):  # torch's own error: one line too
        parse_device("cuda:x", flag="--gpu")


def test_a_directory_as_input_is_one_line_naming_it(run_dir, tmp_path):
    with pytest.raises(SystemExit) as stop:
        predict_main([str(run_dir), str(tmp_path)])
    assert stop.value.code == (f"predict: error: input {str(tmp_path)!r}: Is a directory; INPUT is a text file, one "
                               "sentence (or word) per line, or - for stdin")  # fmt: skip


def test_max_tokens_below_1_is_one_line_naming_the_flag(run_dir, tmp_path):
    (tmp_path / "words.txt").write_text("cat\n")
    with pytest.raises(SystemExit) as stop:
        predict_main([str(run_dir), str(tmp_path / "words.txt"), "--max-tokens", "0"])
    assert stop.value.code == ("predict: error: --max-tokens 0 is invalid; it must be an integer >= 1 (tokens in one "
                               "decoding batch; default 4096)")  # fmt: skip


@pytest.mark.parametrize(("override", "message"), [
    ("decode.beam_size=0", "decode.beam_size=0 is invalid; it must be an integer >= 1"),
    ("decode.length_penalty=-1", "decode.length_penalty=-1 is invalid; it must be >= 0"),
    ("trainer.eval_max_examples=0", "trainer.eval_max_examples=0 is invalid"),
    ("data=local", "data=local needs data.path"),
])  # fmt: skip
def test_bad_decode_and_data_keys_stop_before_training(override, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        train_module.train(make_cfg(override), tmp_path)


def test_the_example_count_keys_set_the_example_counts():  # their former *_max_words names: tests/test_config.py
    cfg = make_cfg("trainer.eval_max_examples=7", "trainer.test_max_examples=9")
    assert (cfg.trainer.eval_max_examples, cfg.trainer.test_max_examples) == (7, 9)


def test_iwslt_preset_has_the_xiong_et_al_model_and_overridable_norm():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=iwslt_de_en", "norm=post_ln"])
    m = cfg.model
    assert (m.n_enc_layers, m.n_dec_layers, m.d_model, m.d_ff, m.n_heads) == (6, 6, 512, 1024, 4)
    assert cfg.data.name == "iwslt2017_de_en" and cfg.data.hub.revision == "refs/convert/parquet"
    assert cfg.norm.placement == "post" and cfg.trainer.device == "cuda" and cfg.decode.beam_size == 5
    model_config(cfg, 10000, 10000)  # a valid model config
