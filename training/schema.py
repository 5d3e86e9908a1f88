"""The run config, typed: one dataclass per config group, checked once at start-up by ``validate``.

``validate(cfg)`` checks the composed Hydra config before anything reads it: every key is known,
every value has its field's type, and every value is in range. The first problem stops the run
with one line naming the key, the value and what is valid, e.g.
``seed='abc' is invalid: expected an integer`` or
``trainer.max_step is not a key of trainer; valid keys: device, compile, ...``; a key that was
renamed names its new key (``trainer.eval_max_words was renamed to trainer.eval_max_examples``).
It returns the typed :class:`RunConfig` that train.py hands down: nothing below train.py reads
the Hydra config.

Types are strict, never coerced: Hydra parses ``seed=abc`` and ``data.keep_stress=maybe`` as
strings and ``logger.project=3`` as an integer, and each of these is an error (a string that
looks like a number is quoted for Hydra: ``"logger.project='3'"``). An integer is accepted
where a number (float) is expected. The checks are this module's rather than Hydra's structured
configs (ConfigStore): OmegaConf coerces ``'3'`` to 3, reports a bad value over several lines,
and has no unions (``float | None`` aside) or tuples of dataclasses (``norm.blocks``).

Groups reuse the dataclasses that consume them: ``ModelConfig`` and ``NormConfig``,
``TelemetryConfig``, and ``data`` has one schema per task (the ``data_config`` its spec names,
``runlog.tasks``: ``data.config.CmudictDataConfig``, ``TranslationDataConfig``) and ``logger`` one per
``logger.name``. This module and what it imports are free of torch, datasets and tokenizers, so a bad
override is reported before they load.
"""

import dataclasses
import importlib
import math
import typing
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from data.config import CmudictDataConfig, TranslationDataConfig
from model.config import ModelConfig, NormConfig
from runlog.tasks import task_spec
from telemetry.config import TelemetryConfig
from training.key_check import check_keys
from training.muon_config import MuonConfig
from training.qk_clip_config import QKClipConfig

DEVICES = ("auto", "cpu", "cuda")
TEST_CHECKPOINTS = ("last", "best")  # training/best.py
PRECISIONS = ("auto", "fp32", "bf16")  # training.precision
DECAYS = ("linear", "cosine", "constant", "inverse_sqrt")  # training.optim.build_scheduler
INVERSE_SQRT_NEEDS_WARMUP = (
    "schedule.decay=inverse_sqrt needs schedule.warmup_steps >= 1, got 0 (it decays as lr * sqrt(warmup_steps / step)); "
    "for a run without warmup use schedule.decay=linear, cosine or constant"
)
MODEL_KEYS_NOT_IN_CONFIG = ("src_vocab", "tgt_vocab", "pad_id", "share_embeddings", "norm")


def _require(ok: bool, key: str, value: object, valid: str) -> None:
    if not ok:
        raise ValueError(f"{key}={value!r} is invalid; {valid}")


@dataclass(frozen=True)
class TrainerConfig:
    """The ``trainer`` keys (``conf/trainer/default.yaml`` documents each).

    Raises:
        ValueError: an unknown device or precision, a count < 1, a grad_clip or peak_tflops <= 0 (null is
            allowed: no clipping; looked up), label_smoothing outside [0, 1), an average_last < 2, or average_last
            with test_checkpoint=best (both choose the weights the final test scores).
    """

    device: str
    compile: bool
    max_steps: int
    max_tokens: int
    grad_accum: int
    grad_clip: float | None
    label_smoothing: float
    log_every: int
    eval_every: int
    checkpoint_every: int
    eval_max_examples: int | None
    test_max_examples: int | None
    peak_tflops: float | None
    test_checkpoint: str = "last"
    precision: str = "auto"  # the default: configs written before the key (fp32 on the CPU, bf16 on CUDA, as they ran)
    average_last: int | None = None  # training/average.py; the default: configs written before the key (off)

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"unknown trainer.device {self.device!r}; valid: {', '.join(DEVICES)}")
        _require(self.precision in PRECISIONS, "trainer.precision", self.precision, f"valid: {', '.join(PRECISIONS)}")
        for key in ("max_steps", "max_tokens", "grad_accum", "log_every", "eval_every", "checkpoint_every"):
            _require(getattr(self, key) >= 1, f"trainer.{key}", getattr(self, key), "it must be an integer >= 1")
        for key in ("eval_max_examples", "test_max_examples"):
            value = getattr(self, key)
            _require(value is None or value >= 1, f"trainer.{key}", value, "it must be null (all) or >= 1")
        clip = self.grad_clip
        _require(
            clip is None or (clip > 0 and math.isfinite(clip)),
            "trainer.grad_clip",
            clip,
            "it must be null (no clipping) or a finite number > 0",
        )
        _require(0 <= self.label_smoothing < 1, "trainer.label_smoothing", self.label_smoothing, "it must be in [0, 1)")
        _require(
            self.peak_tflops is None or self.peak_tflops > 0, "trainer.peak_tflops", self.peak_tflops, "it must be null or > 0"
        )
        _require(
            self.test_checkpoint in TEST_CHECKPOINTS,
            "trainer.test_checkpoint",
            self.test_checkpoint,
            f"valid: {', '.join(TEST_CHECKPOINTS)}",
        )
        _require(
            self.average_last is None or self.average_last >= 2,
            "trainer.average_last",
            self.average_last,
            "it must be null (off) or an integer >= 2 (the checkpoints averaged)",
        )
        if self.average_last is not None and self.test_checkpoint == "best":
            raise ValueError(
                f"trainer.average_last={self.average_last} and trainer.test_checkpoint=best both choose the "
                "weights the final test scores; set one: trainer.average_last=null or "
                "trainer.test_checkpoint=last"
            )


@dataclass(frozen=True)
class OptimConfig:
    """The ``optim`` keys: AdamW's peak learning rate, betas, eps and decoupled weight decay, the
    z-loss coefficient (``training.step.token_losses``; 0: off), weight decay on the gains too (``decay_gains``),
    Muon's keys (``muon``, ``training.muon.MuonConfig``; null: AdamW alone; ``training.optim.build_optimizer``) and
    QK-Clip (``training.qk_clip``; null: off).

    Raises:
        ValueError: lr or eps not a finite number > 0, weight_decay < 0, betas outside [0, 1),
            z_loss not a finite number >= 0, a bad ``muon`` key or value, a bad ``qk_clip`` (``QKClipConfig``).
    """

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    z_loss: float = 0.0
    decay_gains: bool = False
    muon: MuonConfig | None = None
    qk_clip: QKClipConfig | None = None  # a mapping from YAML, made a QKClipConfig below

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))  # a list from YAML
        object.__setattr__(self, "qk_clip", QKClipConfig.from_value(self.qk_clip))
        if isinstance(self.muon, dict):  # the mapping from YAML
            object.__setattr__(self, "muon", MuonConfig.from_keys(self.muon))
        _require(self.lr > 0 and math.isfinite(self.lr), "optim.lr", self.lr, "it must be a finite number > 0")
        _require(self.eps > 0 and math.isfinite(self.eps), "optim.eps", self.eps, "it must be a finite number > 0")
        _require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "it must be >= 0")
        _require(all(0 <= b < 1 for b in self.betas), "optim.betas", list(self.betas), "it must be two numbers in [0, 1)")
        _require(
            self.z_loss >= 0 and math.isfinite(self.z_loss),
            "optim.z_loss",
            self.z_loss,
            "it must be a finite number >= 0 (0: no z-loss; PaLM uses 1e-4)",
        )


@dataclass(frozen=True)
class ScheduleConfig:
    """The ``schedule`` keys: linear warmup steps, then ``decay`` (one of ``DECAYS``; the learning rates:
    ``training.optim.build_scheduler``).

    Raises:
        ValueError: an unknown decay, warmup_steps < 0, ``inverse_sqrt`` without warmup.
    """

    warmup_steps: int
    decay: str

    def __post_init__(self) -> None:
        _require(self.decay in DECAYS, "schedule.decay", self.decay, f"valid: {', '.join(DECAYS)}")
        _require(self.warmup_steps >= 0, "schedule.warmup_steps", self.warmup_steps, "it must be an integer >= 0")
        if self.decay == "inverse_sqrt" and self.warmup_steps == 0:
            raise ValueError(INVERSE_SQRT_NEEDS_WARMUP)


@dataclass(frozen=True)
class DecodeConfig:
    """How hypotheses are searched (the ``decode`` config keys); the defaults are ``conf/config.yaml``'s, for
    ``scripts/predict.py``.

    Attributes:
        beam_size: hypotheses kept per sentence; 1 is greedy decoding.
        length_penalty: alpha of GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, eq. 14).
        max_len_a, max_len_b: a batch whose longest source has S tokens (EOS included) generates
            at most a * S + b tokens (fairseq's ``--max-len-a/-b``), capped by ``model.max_len - 1``.

    Raises:
        ValueError: a value out of range (the message names the key and the valid range).
    """

    beam_size: int = 5
    length_penalty: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.beam_size, int) or self.beam_size < 1:
            raise ValueError(f"decode.beam_size={self.beam_size!r} is invalid; it must be an integer >= 1")
        if not self.length_penalty >= 0:
            raise ValueError(f"decode.length_penalty={self.length_penalty!r} is invalid; it must be >= 0")
        if not (self.max_len_a >= 0 and isinstance(self.max_len_b, int) and self.max_len_a + self.max_len_b >= 1):
            raise ValueError(
                f"decode.max_len_a={self.max_len_a!r}, decode.max_len_b={self.max_len_b!r} are invalid; "
                "a must be >= 0, b an integer, and a + b >= 1"
            )

    def max_len(self, src_len: int) -> int:
        """Most tokens generated for a batch whose longest source has ``src_len`` tokens."""
        return int(self.max_len_a * src_len) + self.max_len_b


@dataclass(frozen=True)
class TrainConfig:
    """The ``train`` keys: ``resume`` is ``auto``, a checkpoint path, or null (start fresh)."""

    resume: str | None


@dataclass(frozen=True)
class WandbLoggerConfig:
    """The ``logger`` keys of ``logger=wandb``: ``wandb.init``'s project, entity, group (null: default)."""

    name: str
    project: str
    entity: str | None
    group: str | None


@dataclass(frozen=True)
class NoLoggerConfig:
    """The ``logger`` keys of ``logger=none`` (metrics.jsonl only)."""

    name: str


LOGGERS = {"wandb": WandbLoggerConfig, "none": NoLoggerConfig}


@dataclass(frozen=True)
class _Composed:
    """The top level of the composed config, for its key and type checks; ``model``, ``data`` and
    ``logger`` are checked by ``validate`` against the schema their content selects."""

    seed: int
    model: dict
    norm: NormConfig
    data: dict
    optim: OptimConfig
    schedule: ScheduleConfig
    trainer: TrainerConfig
    logger: dict
    telemetry: TelemetryConfig
    decode: DecodeConfig
    train: TrainConfig


@dataclass(frozen=True)
class RunConfig:
    """One run's config, checked and typed: what train.py hands down.

    Attributes:
        model: the ``model`` keys with the ``norm`` group as ``model.norm``; vocabulary sizes 1 until
            the data sets them (``training.run.start_run``).
        resolved: the composed config as plain data, interpolations resolved: ``config.yaml``, a
            checkpoint's ``config``, the wandb run's config.
        seed, data, optim, schedule, trainer, logger, telemetry, decode, train: their groups.
    """

    seed: int
    model: ModelConfig
    data: CmudictDataConfig | TranslationDataConfig
    optim: OptimConfig
    schedule: ScheduleConfig
    trainer: TrainerConfig
    logger: WandbLoggerConfig | NoLoggerConfig
    telemetry: TelemetryConfig
    decode: DecodeConfig
    train: TrainConfig
    resolved: dict


def _variant_schemas(values: dict) -> dict[str, tuple[type, str, tuple[str, ...]]]:
    """group -> (schema, its name in messages, fields that are not keys) for the groups whose
    schema depends on their content: model (ModelConfig's sizes), data (its task's), logger (by name).

    Raises:
        ValueError: an unknown ``data.task`` or ``logger.name``.
    """
    task = task_spec(values["data"].get("task"))
    module, cls = task.data_config.split(":")
    name = values["logger"].get("name")
    if name not in LOGGERS:
        raise ValueError(f"unknown logger.name {name!r}; valid: {', '.join(LOGGERS)}")
    return {
        "model": (ModelConfig, "model", MODEL_KEYS_NOT_IN_CONFIG),
        "data": (getattr(importlib.import_module(module), cls), f"data ({task.name})", ()),
        "logger": (LOGGERS[name], f"logger={name}", ()),
    }


def validate(cfg: DictConfig) -> RunConfig:
    """Check every key, type and range of the composed run config (interpolations resolved),
    before any data loads, and return it typed: first keys and types of every group, then each
    group's dataclass checks its own ranges.

    Raises:
        ValueError: the first bad key or value, in one line naming it and what is valid.
    """
    values = OmegaConf.to_container(cfg, resolve=True)
    check_keys(values, _Composed, "", "the config")
    variants = _variant_schemas(values)
    for group, (schema, name, skip) in variants.items():
        check_keys(values[group], schema, f"{group}.", name, skip)
    hints = typing.get_type_hints(_Composed)
    groups = {
        f.name: hints[f.name](**values[f.name])
        for f in dataclasses.fields(_Composed)
        if dataclasses.is_dataclass(hints[f.name]) and f.name != "norm"
    }
    data = variants["data"][0](**values["data"])
    model = ModelConfig.from_dict({"src_vocab": 1, "tgt_vocab": 1, **values["model"], "norm": values["norm"]})
    if groups["optim"].qk_clip is not None and model.attn_softcap is not None:  # QK-Clip would read the capped logits
        raise ValueError(
            f"optim.qk_clip compares each head's max logit q.k / sqrt(d_head) with tau, and model.attn_softcap="
            f"{model.attn_softcap} caps them first, so it would read capped ones: use one of the two (optim.qk_clip=null "
            "or model.attn_softcap=null)"
        )
    logger = variants["logger"][0](**values["logger"])
    return RunConfig(seed=values["seed"], model=model, data=data, logger=logger, resolved=values, **groups)
