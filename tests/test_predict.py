"""scripts/predict.py (run as ``python -m scripts.predict``) on a G2P checkpoint, the decode keys' checks and the IWSLT preset."""

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

import train as train_module
from scripts.predict import load_model, predict
from tests.conftest import ROOT, make_cfg, model_config
from training.evaluate import DecodeConfig


def test_predict_spells_words_with_a_g2p_checkpoint(tmp_path):
    train_module.train(make_cfg("trainer.max_steps=10", "telemetry.every=0"), tmp_path)
    model, src, tgt, task = load_model(str(tmp_path / "checkpoint.pt"), device=None)
    assert task.name == "g2p"
    for beam in (1, 3):
        out = predict(["Cat", "", "phoneme"], model, src, tgt, task, DecodeConfig(beam_size=beam), 1024, device=None)
        assert len(out) == 3 and out[1] == "" and set(" ".join(out).split()) <= set(tgt.get_vocab())  # phonemes
    assert predict(["cat"], model, src, tgt, task, DecodeConfig(beam_size=1), 1024, device=None)[0]  # untrained: babble
    (tmp_path / "words.txt").write_text("cat\nhello\n")
    proc = subprocess.run([sys.executable, "-m", "scripts.predict", str(tmp_path / "checkpoint.pt"),
                           str(tmp_path / "words.txt"), "--beam-size", "1"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "scripts.predict", str(tmp_path / "nope.pt")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.startswith("predict: error: no checkpoint file at")


def test_predict_takes_a_run_dir_and_says_what_it_read(tmp_path):
    train_module.train(make_cfg("trainer.max_steps=10", "telemetry.every=0"), tmp_path)  # model.max_len 64
    (tmp_path / "words.txt").write_text(f"abc123\nHello\nnew york\n{'a' * 60}xyzw\n")
    words = str(tmp_path / "words.txt")
    proc = subprocess.run([sys.executable, "-m", "scripts.predict", str(tmp_path), words, "--beam-size=1"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 4  # one prediction per word, on stdout alone
    test = json.loads((tmp_path / "status.json").read_text())["test"]
    assert proc.stderr.splitlines() == [
        f"predict: {tmp_path / 'checkpoint.pt'} at step 10 of 10; test PER {test['test/per']:.2%}, WER {test['test/wer']:.2%}",
        "predict: line 1 'abc123': not in the vocabulary, read as <unk>: '1' '2' '3'",  # digits: no CMUdict letters
        "predict: line 3 'new york': not in the vocabulary, read as <unk>: ' '",
        "predict: line 4: longer than 63 tokens (model.max_len - 1); dropped: 'w'",
    ]


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
