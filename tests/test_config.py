"""The config schema (training/schema.py): every preset validates; a wrong key, type or value
stops with one line naming the key, the value and what is valid, before any data loads."""

import itertools
import os
import shutil
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

import train as train_module
from runlog.renames import renamed_override, with_current_names
from tests.helpers.config import NEEDS, ROOT, make_cfg, presets
from training.checkpoint import load_checkpoint, save_checkpoint
from training.cli import register_resolvers
from training.schema import DECAYS, validate

TRANSLATION_KEYS = "name, source, src_lang, tgt_lang, hub, path, max_len, max_examples, vocab_size, joint_vocab, cache_dir, task"


def sweep_jobs(params: dict | None) -> list[list[str]]:
    """The override lists of the jobs a sweeper's ``params`` expand to (one empty job when none)."""
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in (params or {}).items()])
    choices = [  # +group kept; a single value (norm: pre_ln) is one choice, as Hydra's BasicSweeper takes it
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
        if o.is_sweep_override()
        else [f"{o.get_key_element()}={o.get_value_element_as_str()}"]
        for o in parsed
    ]
    return [list(job) for job in itertools.product(*choices)]


def key_overrides(job: list[str]) -> list[tuple[str, object]]:
    """(key, value) of each override in ``job``, the value typed as Hydra's override parser types it."""
    return [(o.key_or_group, o.value()) for o in OverridesParser.create().parse_overrides(job)]


def test_every_preset_composes_and_validates():
    found = presets()
    assert len(found) >= 27  # at abc122c: 3 model, 9 norm, 5 data, 1 optim, 1 schedule, 3 trainer, 2 logger, 3 telemetry
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for preset in found:
            validate(compose("config", overrides=[preset, *NEEDS.get(preset, [])]))


def test_every_job_of_every_experiment_sweep_composes_and_validates():
    # Hydra composes a job from its config-group choices (norm=post_ln), then sets its key overrides
    # (seed=1, optim.lr=3e-3) on the result: compose once per group combination and set the keys on a copy,
    # as Hydra would (struct mode: a key the config lacks is an error here too).
    jobs = 0
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
            experiment = f"+experiment={path.stem}"
            params = compose("config", overrides=[experiment], return_hydra_config=True).hydra.sweeper.params
            composed = {}
            for job in sweep_jobs(params):
                groups = tuple(o for o in job if (ROOT / "conf" / o.split("=")[0].lstrip("+")).is_dir())
                if groups not in composed:
                    composed[groups] = compose("config", overrides=[experiment, *groups])
                cfg = composed[groups].copy()
                for key, value in key_overrides([o for o in job if o not in groups]):
                    OmegaConf.update(cfg, key, value, merge=False)
                validate(cfg)
                jobs += 1
    assert jobs >= 1 + 8 + 15 + 12 + 30  # iwslt_de_en (one run), impl_parity, norm_ablation, warmup_sensitivity, batch_vs_layer


def test_setting_a_sweep_jobs_keys_on_a_composed_config_is_what_hydra_composes():
    # The shortcut the test above takes, checked on a job of each kind of key (int, float, string).
    job = ["norm=post_ln", "seed=2", "optim.lr=3e-3", "norm.impl=native", "schedule.warmup_steps=60"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        hydra_composed = compose("config", overrides=["+experiment=lr_sensitivity", *job])
        cfg = compose("config", overrides=["+experiment=lr_sensitivity", "norm=post_ln"])
    for key, value in key_overrides(job[1:]):
        OmegaConf.update(cfg, key, value, merge=False)
    assert OmegaConf.to_container(cfg, resolve=True) == OmegaConf.to_container(hydra_composed, resolve=True)
    with pytest.raises(Exception, match="Key 'lrr' is not in struct"):
        OmegaConf.update(cfg, "optim.lrr", 1.0, merge=False)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("seed=abc", "seed='abc' is invalid: expected an integer"),
        ("data.keep_stress=maybe", "data.keep_stress='maybe' is invalid: expected a boolean (true or false)"),
        ("trainer.max_steps=1.5", "trainer.max_steps=1.5 is invalid: expected an integer"),
        ("optim.lr=abc", "optim.lr='abc' is invalid: expected a number"),
        ("trainer.compile=yes", "trainer.compile='yes' is invalid: expected a boolean (true or false)"),
        ("trainer.grad_clip=abc", "trainer.grad_clip='abc' is invalid: expected a number or null"),
        ("trainer.eval_max_examples=true", "trainer.eval_max_examples=True is invalid: expected an integer or null"),
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
         "grad_accum, grad_clip, label_smoothing, log_every, eval_every, checkpoint_every, eval_max_examples, "
         "test_max_examples, peak_tflops, test_checkpoint, precision, average_last"),
        ("+seeds=1", "seeds is not a key of the config; valid keys: seed, model, norm, data, optim, schedule, trainer, logger, "
         "telemetry, decode, train"),
        ("+model.vocab=5", "model.vocab is not a key of model; valid keys: d_model, n_heads, d_ff, n_enc_layers, n_dec_layers, "
         "dropout, attn_dropout, act_dropout, max_len, positions, tie_embeddings, weight_norm, residual_streams, attn_gate, "
         "attn_sink, attn_softmax, attn_softcap, final_softcap, parametrization, base_d_model, base_depth"),
        ("data=multi30k +data.keep_stress=true", f"data.keep_stress is not a key of data (translation); valid keys: "
         f"{TRANSLATION_KEYS}"),
        ("data=multi30k +data.hub.splits.dev=x", "data.hub.splits.dev is not a key of data.hub.splits; valid keys: train, "
         "valid, test"),
        ("data=multi30k data.vocab_size=8k", "data.vocab_size='8k' is invalid: expected an integer"),
        ("data.task=g2q", "data.task='g2q' is invalid; valid: g2p, translation (set by the data preset, conf/data/)"),
        ("~data.task", "data.task=None is invalid; valid: g2p, translation (set by the data preset, conf/data/)"),
        ("~trainer.grad_clip", "trainer.grad_clip is missing: expected a number or null"),
        ("logger.name=mlflow", "unknown logger.name 'mlflow'; valid: wandb, none"),
        ("optim.eps=0", "optim.eps=0 is invalid; it must be a finite number > 0"),
        ("trainer.grad_clip=0", "trainer.grad_clip=0 is invalid; it must be null (no clipping) or a finite number > 0"),
        ("schedule.decay=exp", f"schedule.decay='exp' is invalid; valid: {', '.join(DECAYS)}"),
        ("trainer.precision=fp16", "trainer.precision='fp16' is invalid; valid: auto, fp32, bf16"),
        ("trainer.precision=16", "trainer.precision=16 is invalid: expected a string"),
        ("optim.z_loss=-1e-4", "optim.z_loss=-0.0001 is invalid; it must be a finite number >= 0 (0: no z-loss; PaLM uses 1e-4)"),
        ("optim.z_loss=inf", "optim.z_loss=inf is invalid; it must be a finite number >= 0 (0: no z-loss; PaLM uses 1e-4)"),
        ("optim.z_loss=abc", "optim.z_loss='abc' is invalid: expected a number"),
        ("telemetry.attn_max_logit=1", "telemetry.attn_max_logit=1 is invalid: expected a boolean (true or false)"),
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
    valid = "lr, betas, eps, weight_decay, z_loss, decay_gains, muon, qk_clip"
    assert str(error.value) == f"optim.weight_decy is not a key of optim; valid keys: {valid}"


@pytest.mark.parametrize(
    "overrides",
    [
        "trainer.grad_clip=null",  # no clipping
        "optim.lr=1",  # an integer is a number
        "optim.z_loss=0",  # off; an integer is a number
        "optim.z_loss=1e-4",  # PaLM's value
        "logger=wandb logger.project='3'",  # a quoted number is a string
        "trainer.eval_max_examples=null trainer.peak_tflops=989",
        *(f"trainer.precision={p}" for p in ("auto", "fp32", "bf16")),
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


# Each norm preset's composed values at abc122c, when every preset file repeated every key:
# name -> (kind, impl, placement); eps 1e-5 and bias true in all of them.
NORM_PRESETS_AT_ABC122C = {
    "deepnorm": ("layernorm", "custom", "deepnorm"),
    "no_norm": ("none", "custom", "pre"),
    "post_ln": ("layernorm", "custom", "post"),
    "post_rms": ("rmsnorm", "custom", "post"),
    "pre_dyt": ("dyt", "custom", "pre"),
    "pre_ln": ("layernorm", "custom", "pre"),
    "pre_rms": ("rmsnorm", "custom", "pre"),
    "pre_scalenorm": ("scalenorm", "custom", "pre"),
    "sandwich_ln": ("layernorm", "custom", "sandwich"),
}


def test_norm_presets_compose_to_the_values_they_had_before_the_shared_base():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for name, (kind, impl, placement) in NORM_PRESETS_AT_ABC122C.items():
            norm = OmegaConf.to_container(compose("config", overrides=[f"norm={name}"]).norm)
            off = {"qk": None, "v": None, "blocks": None, "mix_ln_alpha": 0.25, "decoder_batch_stats": False,  # added later
                   "knobs": {"powernorm": {"warmup_iters": "${schedule.warmup_steps}", "group_num": "${model.n_heads}"}},
                   "gain": "plain",
                   "qk_scope": "head", "gpas": False, "hc": None, "alpha_init_attn": 0.5, "alpha_init_ffn": 0.5,
                   "alpha_init_final": 0.5, "learned_embed_scale": False}  # fmt: skip
            assert norm == {"kind": kind, "impl": impl, "placement": placement, "eps": 1e-5, "bias": True, **off}, name
    assert make_cfg().norm == make_cfg("norm=pre_ln").norm  # still the default


def test_each_norm_preset_states_only_what_differs_from_the_base():
    base = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "norm_base.yaml"))
    presets = sorted((ROOT / "conf" / "norm").glob("*.yaml"))
    assert {p.stem for p in presets} >= set(NORM_PRESETS_AT_ABC122C)
    model_base = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model_base.yaml"))
    top_level = []
    for path in presets:
        own = OmegaConf.to_container(OmegaConf.load(path))
        if own["defaults"] == ["/norm_base@norm", "_self_"]:  # a preset that sets model keys too: written at the top
            top_level.append(path.stem)
            assert path.read_text().startswith("# @package _global_\n") and set(own) == {"defaults", "norm", "model"}
            own, model = own["norm"], own["model"]
            assert all(key in model_base and model_base[key] != value for key, value in model.items()), (path.name, model)
        else:
            assert own.pop("defaults") == ["/norm_base@_here_", "_self_"], path.name
        assert all(key in base and base[key] != value for key, value in own.items()), (path.name, own)
    assert top_level == ["gemma2", "qwen3next"]


def test_help_lists_the_norm_presets_and_not_their_base():
    # the base the presets start from was a member of the norm group, so --help offered it.
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (norm,) = [line for line in done.stdout.splitlines() if line.startswith("norm: ")]
    assert norm.removeprefix("norm: ").split(", ") == sorted(p.stem for p in (ROOT / "conf" / "norm").glob("*.yaml"))
    assert "norm_base" not in done.stdout and {"pre_ln", "pre_ln_qk"} <= set(norm.removeprefix("norm: ").split(", "))


RENAMES = [("trainer.eval_max_words", "trainer.eval_max_examples"), ("trainer.test_max_words", "trainer.test_max_examples")]


@pytest.mark.parametrize(("old", "new"), RENAMES)
def test_a_renamed_key_in_an_override_or_a_preset_file_names_its_new_key(old, new, tmp_path):
    with pytest.raises(ValueError) as error:
        validate(make_cfg(f"+{old}=100"))
    assert str(error.value) == f"{old} was renamed to {new}"
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "conf" / "trainer" / "mine.yaml").write_text(f"defaults: [default, _self_]\n{old.split('.')[1]}: 100\n")
    with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["trainer=mine"])
    with pytest.raises(ValueError) as error:
        validate(cfg)
    assert str(error.value) == f"{old} was renamed to {new}"


def test_cli_renamed_key_exits_1_naming_the_new_key_before_hydra_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model=tiny", "trainer=smoke", "logger=none", "trainer.eval_max_words=100"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1
    assert [line for line in proc.stderr.splitlines() if "error" in line] == [
        "normlab: error: trainer.eval_max_words was renamed to trainer.eval_max_examples"
    ]
    assert "Traceback" not in proc.stderr and not (tmp_path / "outputs").exists()  # no run dir: Hydra never started


def test_renamed_override_reads_every_override_form():
    message = "trainer.test_max_words was renamed to trainer.test_max_examples"
    for arg in ("trainer.test_max_words=5", "+trainer.test_max_words=5", "++trainer.test_max_words=5",
                "~trainer.test_max_words", "trainer.test_max_words=1,2"):  # fmt: skip
        assert renamed_override(["-m", "model=tiny", arg]) == message, arg
    assert renamed_override(["trainer=smoke", "trainer.test_max_examples=5", "hydra.run.dir=x/trainer.test_max_words=1"]) is None


def test_a_config_saved_with_the_old_names_reads_with_the_new_ones():
    # abc122c saved both names, the new ones interpolated from the old.
    old = {"seed": 0, "trainer": {"max_steps": 20, "eval_max_words": 7, "test_max_words": None,
                                  "eval_max_examples": 7, "test_max_examples": None}}  # fmt: skip
    assert with_current_names(old) == {"seed": 0, "trainer": {"max_steps": 20, "eval_max_examples": 7, "test_max_examples": None}}
    assert old["trainer"]["eval_max_words"] == 7  # not modified
    assert with_current_names({"trainer": {"eval_max_words": 3}}) == {"trainer": {"eval_max_examples": 3}}
    assert with_current_names({"seed": 1}) == {"seed": 1}
    old_run = {"norm": {"kind": "layernorm"}, "optim": {"lr": 1e-3}}  # saved before norm.mix_ln_alpha, optim.z_loss, ...
    filled = {"norm": {"kind": "layernorm", "mix_ln_alpha": 0.25, "decoder_batch_stats": False,
                       "knobs": {"powernorm": {"warmup_iters": 10000, "group_num": 1}}, "gain": "plain", "qk_scope": "head",
                       "gpas": False, "hc": None,
                       "alpha_init_attn": 0.5, "alpha_init_ffn": 0.5, "alpha_init_final": 0.5, "learned_embed_scale": False},
              "optim": {"lr": 1e-3, "z_loss": 0.0, "decay_gains": False, "qk_clip": None}}  # fmt: skip
    assert with_current_names(old_run) == filled


def test_a_checkpoint_with_the_old_key_names_resumes_reporting_only_real_changes(tmp_path, capsys):
    small = ["telemetry.every=0", "trainer.eval_max_examples=5", "trainer.test_max_examples=5"]
    train_module.train(make_cfg("trainer.max_steps=2", *small), tmp_path)
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    ckpt["config"]["trainer"] |= {"eval_max_words": 5, "test_max_words": 5}  # as abc122c wrote it
    save_checkpoint(tmp_path, ckpt)
    capsys.readouterr()
    test = train_module.train(make_cfg("trainer.max_steps=3", *small), tmp_path)
    out = capsys.readouterr().out
    changed = "with changed settings: trainer.max_steps: checkpoint 2, this run 3"
    assert f"resuming from step 2 (checkpoint {tmp_path / 'checkpoint.pt'}) {changed}\n" in out
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 3 and 0 <= test["test/wer"] <= 1


def test_run_dir_is_named_from_the_resolved_norm_keys_not_the_preset(tmp_path):
    # NORMLAB_RUN_STAMP is how every torchrun rank gets rank 0's start time (training/distributed.py).
    stamp = "2020-01-02/03-04-05"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model=tiny", "trainer=smoke", "logger=none", "norm=sandwich_ln",
         "norm.kind=rmsnorm", "trainer.max_steps=0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "NORMLAB_RUN_STAMP": stamp},
    )  # fmt: skip
    assert proc.returncode == 1 and "trainer.max_steps=0 is invalid" in proc.stderr  # stops early, its dir made
    assert [p.name for p in (tmp_path / "outputs" / "2020-01-02").iterdir()] == ["03-04-05_sandwich-rmsnorm-custom"]
    register_resolvers()  # as train.py does before Hydra composes (the run dir reads ${norm_label:${norm}})
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["norm=post_rms", "norm.impl=native"], return_hydra_config=True)
    assert cfg.hydra.run.dir.endswith("_post-rmsnorm-native") and "post_rms" not in cfg.hydra.run.dir


def test_the_config_checks_import_without_torch_or_the_data_libraries():
    """A bad override is reported before torch, datasets, tokenizers or wandb load (seconds)."""
    heavy = ("torch", "datasets", "tokenizers", "wandb")
    code = f"import sys, training.schema, training.cli, training.sweep; print([m for m in {heavy} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "[]"
