"""Start-up checks of the run-level config keys (trainer, optim, schedule) that the typed
model and telemetry configs do not cover: a bad value stops the run before any work, with a
message naming the key, the value and what is valid."""

import math

from omegaconf import DictConfig

from training.evaluate import DecodeConfig
from training.optim import DECAYS, INVERSE_SQRT_NEEDS_WARMUP


def _require(ok: bool, key: str, value: object, valid: str) -> None:
    if not ok:
        raise ValueError(f"{key}={value!r} is invalid; {valid}")


def check_run_config(cfg: DictConfig) -> None:
    """Raise ``ValueError`` for the first out-of-range trainer/optim/schedule/decode value."""
    tc = cfg.trainer
    for key in ("max_steps", "max_tokens", "grad_accum", "log_every", "eval_every", "checkpoint_every"):
        value = tc[key]
        _require(isinstance(value, int) and value >= 1, f"trainer.{key}", value, "it must be an integer >= 1")
    for key in ("eval_max_words", "test_max_words", "eval_max_examples", "test_max_examples"):
        value = tc[key]
        _require(
            value is None or (isinstance(value, int) and value >= 1), f"trainer.{key}", value, "it must be null (all) or >= 1"
        )
    clip = tc.grad_clip
    _require(clip is None or (clip > 0 and math.isfinite(clip)), "trainer.grad_clip", clip,
             "it must be null (no clipping) or a finite number > 0")  # fmt: skip
    _require(isinstance(tc.compile, bool), "trainer.compile", tc.compile, "it must be true or false")
    _require(tc.peak_tflops is None or tc.peak_tflops > 0, "trainer.peak_tflops", tc.peak_tflops, "it must be null or > 0")
    resume = cfg.train.resume
    _require(resume is None or isinstance(resume, str), "train.resume", resume, "it must be auto, null or a checkpoint path")
    DecodeConfig(**cfg.decode)
    _require(0 <= tc.label_smoothing < 1, "trainer.label_smoothing", tc.label_smoothing, "it must be in [0, 1)")
    _require(cfg.optim.lr > 0 and math.isfinite(cfg.optim.lr), "optim.lr", cfg.optim.lr, "it must be a finite number > 0")
    _require(cfg.optim.weight_decay >= 0, "optim.weight_decay", cfg.optim.weight_decay, "it must be >= 0")
    _require(cfg.schedule.decay in DECAYS, "schedule.decay", cfg.schedule.decay, f"valid: {', '.join(DECAYS)}")
    _require(isinstance(cfg.schedule.warmup_steps, int) and cfg.schedule.warmup_steps >= 0, "schedule.warmup_steps",
             cfg.schedule.warmup_steps, "it must be an integer >= 0")  # fmt: skip
    if cfg.schedule.decay == "inverse_sqrt" and cfg.schedule.warmup_steps == 0:
        raise ValueError(INVERSE_SQRT_NEEDS_WARMUP)
    _require(len(cfg.optim.betas) == 2 and all(0 <= b < 1 for b in cfg.optim.betas), "optim.betas", list(cfg.optim.betas),
             "it must be two numbers in [0, 1)")  # fmt: skip
