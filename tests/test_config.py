"""The config schema (training/schema.py): every preset validates; a wrong key, type or value
stops with one line naming the key, the value and what is valid, before any data loads."""

import itertools
import shutil
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from tests.conftest import ROOT, make_cfg
from training.optim import DECAYS
from training.schema import validate

GROUPS = ("model", "norm", "data", "optim", "schedule", "trainer", "logger", "telemetry")
NEEDS = {"data=local": ["data.path=/corpus"]}  # a preset with a required key left to the user
TRANSLATION_KEYS = "name, source, src_lang, tgt_lang, hub, path, max_len, max_examples, vocab_size, joint_vocab, cache_dir"


def sweep_jobs(params: dict | None) -> list[list[str]]:
    """The override lists of the jobs a sweeper's ``params`` expand to (one empty job when none)."""
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in (params or {}).items()])
    choices = [[f"{o.key_or_group}={v}" for v in o.sweep_string_iterator()] for o in parsed]
    return [list(job) for job in itertools.product(*choices)]


def test_every_preset_composes_and_validates():
    presets = [f"{g}={p.stem}" for g in GROUPS for p in sorted((ROOT / "conf" / g).glob("*.yaml"))]
    assert len(presets) >= 27  # at abc122c: 3 model, 9 norm, 5 data, 1 optim, 1 schedule, 3 trainer, 2 logger, 3 telemetry
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for preset in presets:
            validate(compose("config", overrides=[preset, *NEEDS.get(preset, [])]))


def test_every_job_of_every_experiment_sweep_composes_and_validates():
    jobs = 0
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
            experiment = f"+experiment={path.stem}"
            params = compose("config", overrides=[experiment], return_hydra_config=True).hydra.sweeper.params
            for job in sweep_jobs(params):
                validate(compose("config", overrides=[experiment, *job]))
                jobs += 1
    assert jobs >= 1 + 8 + 15 + 12  # iwslt_de_en (one run), impl_parity, norm_ablation, warmup_sensitivity


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("seed=abc", "seed='abc' is invalid: expected an integer"),
        ("data.keep_stress=maybe", "data.keep_stress='maybe' is invalid: expected a boolean (true or false)"),
        ("trainer.max_steps=1.5", "trainer.max_steps=1.5 is invalid: expected an integer"),
        ("optim.lr=abc", "optim.lr='abc' is invalid: expected a number"),
        ("trainer.compile=yes", "trainer.compile='yes' is invalid: expected a boolean (true or false)"),
        ("trainer.grad_clip=abc", "trainer.grad_clip='abc' is invalid: expected a number or null"),
        ("trainer.eval_max_words=true", "trainer.eval_max_words=True is invalid: expected an integer or null"),
        ("logger=wandb logger.project=3", "logger.project=3 is invalid: expected a string"),
        ("model.tie_embeddings=maybe", "model.tie_embeddings='maybe' is invalid: expected a boolean (true or false)"),
        ("model.dropout=abc", "model.dropout='abc' is invalid: expected a number"),
        ("norm.bias=maybe", "norm.bias='maybe' is invalid: expected a boolean (true or false)"),
        ("telemetry.every=x", "telemetry.every='x' is invalid: expected an integer"),
        ("telemetry.sites=[embed,3]", "telemetry.sites=['embed', 3] is invalid: expected a list of strings"),
        ("optim.betas=[0.9]", "optim.betas=[0.9] is invalid: expected a list of 2 numbers"),
        ("decode.beam_size=2.0", "decode.beam_size=2.0 is invalid: expected an integer"),
        ("train.resume=3", "train.resume=3 is invalid: expected a string or null"),
        ("+trainer.max_step=5", "trainer.max_step is not a key of trainer; valid keys: device, compile, max_steps, max_tokens, "
         "grad_accum, grad_clip, label_smoothing, log_every, eval_every, checkpoint_every, eval_max_words, test_max_words, "
         "eval_max_examples, test_max_examples, peak_tflops"),
        ("+seeds=1", "seeds is not a key of the config; valid keys: seed, model, norm, data, optim, schedule, trainer, logger, "
         "telemetry, decode, train"),
        ("+model.vocab=5", "model.vocab is not a key of model; valid keys: d_model, n_heads, d_ff, n_enc_layers, n_dec_layers, "
         "dropout, attn_dropout, act_dropout, max_len, positions, tie_embeddings"),
        ("data=multi30k +data.keep_stress=true", f"data.keep_stress is not a key of data (translation); valid keys: "
         f"{TRANSLATION_KEYS}"),
        ("data=multi30k +data.hub.splits.dev=x", "data.hub.splits.dev is not a key of data.hub.splits; valid keys: train, "
         "valid, test"),
        ("data=multi30k data.vocab_size=8k", "data.vocab_size='8k' is invalid: expected an integer"),
        ("~trainer.grad_clip", "trainer.grad_clip is missing: expected a number or null"),
        ("logger.name=mlflow", "unknown logger.name 'mlflow'; valid: wandb, none"),
        ("optim.eps=0", "optim.eps=0 is invalid; it must be a finite number > 0"),
        ("trainer.grad_clip=0", "trainer.grad_clip=0 is invalid; it must be null (no clipping) or a finite number > 0"),
        ("schedule.decay=exp", f"schedule.decay='exp' is invalid; valid: {', '.join(DECAYS)}"),
    ],
)  # fmt: skip
def test_a_bad_key_type_or_value_is_one_line_naming_it(overrides, message):
    with pytest.raises(ValueError) as error:
        validate(make_cfg(*overrides.split()))
    assert str(error.value) == message


def test_a_misspelt_key_in_a_preset_file_names_the_valid_keys(tmp_path):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "conf" / "optim" / "typo.yaml").write_text("defaults: [adamw, _self_]\nweight_decy: 0.1\n")
    with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["optim=typo"])
    with pytest.raises(ValueError) as error:
        validate(cfg)
    assert str(error.value) == "optim.weight_decy is not a key of optim; valid keys: lr, betas, eps, weight_decay"


@pytest.mark.parametrize(
    "overrides",
    [
        "trainer.grad_clip=null",  # no clipping
        "optim.lr=1",  # an integer is a number
        "logger=wandb logger.project='3'",  # a quoted number is a string
        "trainer.eval_max_examples=null trainer.peak_tflops=989",
        *(f"schedule.decay={d}" for d in DECAYS),
    ],
)
def test_edge_values_of_the_right_type_validate(overrides):
    validate(make_cfg(*overrides.split()))


def test_cli_wrong_type_exits_1_with_one_error_line_before_data_loads(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model=tiny", "trainer=smoke", "logger=none", "seed=abc",
         f"hydra.run.dir={tmp_path}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1
    assert [line for line in proc.stderr.splitlines() if "normlab: error:" in line] == [
        "normlab: error: seed='abc' is invalid: expected an integer"
    ]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "src_vocab.json").exists()  # written once the data is loaded
