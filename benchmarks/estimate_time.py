"""The estimates of ``python -m scripts.estimate_time``: per job of a sweep, the FLOPs of a training step counted on the
meta device and by formula, and the wall time they imply at a GPU's peak and an assumed MFU."""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # its job expansion, the one -m runs
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data.batching import Seq2SeqData, batch_shape, make_batches, train_stream
from data.tokenizer import PAD_ID
from model.batch_reading import BatchReadingNorm
from model.transformer import EncoderDecoder
from training.cli import CONF, hydra_error_line, override_error
from training.flops import PEAK_BF16_FLOPS, counted_train_flops, train_flops
from training.schema import RunConfig, validate

if TYPE_CHECKING:
    from training.tasks import Task


DEFAULT_GPU = "H200"
DEFAULT_MFU = 0.15  # an assumption for a small model (module docstring)
META = torch.device("meta")


@dataclass(frozen=True)
class Estimate:
    """The cost of one run of a group of jobs (FLOPs, not seconds: :func:`wall_seconds` converts).

    Attributes:
        label: the overrides the group's jobs share and the other jobs do not ("" for one group).
        jobs: runs in the group; params: fewest and most model parameters among them (norms differ);
        batch: (B, S, T) of the first step's first batch.
        counted: FLOPs per step, FlopCounterMode; formula: ``training.flops.train_flops`` on the same batches.
        steps: ``trainer.max_steps``; epochs: steps over the training split's batches per epoch.
        loss_flops, decode_flops: the run's validation-loss passes and decoding (formula; decoding an upper bound);
        decoder_calls: its sequential decoder steps.
    """

    label: str
    jobs: int
    params: tuple[int, int]
    batch: tuple[int, int, int]
    counted: int
    formula: float
    steps: int
    epochs: float
    loss_flops: float
    decode_flops: float
    decoder_calls: int

    @property
    def eval_flops(self) -> float:
        return self.loss_flops + self.decode_flops

    @property
    def run_flops(self) -> float:
        return self.steps * self.counted + self.eval_flops


def wall_seconds(flops: float, peak_flops: float, mfu: float) -> float:
    """Seconds to do ``flops`` at ``mfu`` x ``peak_flops`` (FLOP/s); raises ValueError unless 0 < mfu <= 1."""
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu={mfu} is invalid; MFU is a fraction of the peak in (0, 1], e.g. 0.15")
    return flops / (peak_flops * mfu)


def job_configs(overrides: list[str]) -> list[tuple[list[str], RunConfig]]:
    """Every job ``python train.py -m <overrides>`` would run, with its validated config.

    A job's swept plain keys (``seed=1``, ``optim.lr=3e-3``) are set on the composition of its other overrides
    rather than composed anew each (0.3 s a composition), as ``tests/test_config.py`` checks Hydra would.

    Raises:
        ValueError: a renamed key, ``norm=<kind>``, or a bad override, key or value (one line).
    """
    if error := override_error(overrides):
        raise ValueError(error)
    parser = OverridesParser.create()
    try:
        fixed = [o.input_line for o in parser.parse_overrides(overrides) if not o.is_sweep_override() and o.input_line]
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            params = compose("config", overrides=fixed, return_hydra_config=True).hydra.sweeper.params or {}
            given_last = [*(f"{k}={v}" for k, v in params.items()), *overrides]  # a key given on the line wins, as in Hydra
            jobs = BasicSweeper.split_arguments(parser.parse_overrides(given_last), None)[0]
            swept = {o.split("=")[0] for o in jobs[0] if any(o not in job for job in jobs)}
            composed, out = {}, []
            for job in jobs:
                keys = [o for o in job if o.split("=")[0] in swept and not _is_group(o)]
                rest = tuple(o for o in job if o not in keys)
                if rest not in composed:
                    composed[rest] = compose("config", overrides=list(rest))
                cfg = composed[rest].copy()
                for o in parser.parse_overrides(keys):
                    OmegaConf.update(cfg, o.key_or_group, o.value(), merge=False)
                out.append((job, validate(cfg)))
    except (HydraException, OmegaConfBaseException) as e:
        raise ValueError(hydra_error_line(e)) from None
    return out


def _is_group(override: str) -> bool:
    """A config-group choice (``norm=post_ln``, ``+experiment=x``) or a key added / deleted (``+k=v``, ``~k``)."""
    key = override.split("=")[0]
    return key.startswith(("+", "~")) or (CONF / key).is_dir()


def estimate(overrides: list[str]) -> list[Estimate]:
    """One :class:`Estimate` per distinct (model, data, trainer, decode) among the jobs of ``overrides``; groups
    whose printed row would be the same but for the parameter count are merged (their labels joined).

    Raises:
        ValueError: as :func:`job_configs`, or a model that cannot run on the meta device.
        FileNotFoundError: data neither cached nor reachable.
    """
    from training.tasks import build_task  # loads the data code (seconds): after the config has checked out

    jobs = job_configs(overrides)
    groups: dict[str, list[tuple[list[str], RunConfig]]] = {}
    for job, cfg in jobs:
        groups.setdefault(repr((cfg.model, cfg.data, cfg.trainer, cfg.decode)), []).append((job, cfg))
    common = set.intersection(*(set(job) for job, _ in jobs))
    rows: dict[tuple, Estimate] = {}
    for members in groups.values():
        shared = set.intersection(*(set(job) for job, _ in members)) - common
        label = " ".join(o for o in members[0][0] if o in shared)
        cfg = members[0][1]
        est = _estimate_run(cfg, build_task(cfg, None, None), label, len(members))
        key = tuple(_cells(est, 1.0, 1.0)[3:-1])  # the printed row but for jobs, label, parameters and the jobs' hours
        rows[key] = _merged(rows[key], est) if key in rows else est
    return list(rows.values())


def _estimate_run(cfg: RunConfig, task: "Task", label: str, jobs: int) -> Estimate:
    """The :class:`Estimate` of one run of ``cfg`` (a group of ``jobs`` runs labelled ``label``) on ``task``'s data."""
    tc = cfg.trainer
    mcfg = replace(
        cfg.model,
        src_vocab=task.src_vocab.get_vocab_size(),
        tgt_vocab=task.tgt_vocab.get_vocab_size(),
        pad_id=PAD_ID,
        share_embeddings=task.share_embeddings,
    )
    with META:
        model = EncoderDecoder(mcfg)
    step = next(train_stream(task.data["train"], tc.max_tokens, cfg.seed, accum=tc.grad_accum))
    try:
        _, counted = counted_train_flops(model, [b.to(META) for b in step.micro], tc.label_smoothing, cfg.optim.z_loss)
    except (NotImplementedError, RuntimeError) as e:  # data-dependent code (e.g. boolean indexing) cannot run on meta
        reason = str(e).splitlines()[0]
        raise ValueError(f"{label or 'this run'}: its model cannot be counted on the meta device: {reason}") from None
    formula = sum(train_flops(mcfg, *shape[:3]) for shape in step.shapes)
    per_epoch = len(make_batches(task.data["train"], tc.max_tokens))
    evals = len({*range(tc.eval_every, tc.max_steps + 1, tc.eval_every), tc.max_steps})
    batch_reading = any(isinstance(m, BatchReadingNorm) for m in model.modules())  # a second valid-loss pass
    valid = task.data["valid"]
    loss_pass = sum(train_flops(mcfg, *batch_shape(valid, i)[:3]) for i in make_batches(valid, tc.max_tokens)) / 3
    loss_flops = loss_pass * (evals + 1) * (2 if batch_reading else 1)  # + 1: the loss at step 0
    decode_flops, calls = 0.0, 0
    for split, max_examples, times in (("valid", tc.eval_max_examples, evals), ("test", tc.test_max_examples, 1)):
        src = task.eval_sets[split].subset(max_examples).src
        for index in make_batches(Seq2SeqData(list(src), [[] for _ in src]), tc.max_tokens):
            rows, longest = len(index), max(len(src[i]) for i in index) + 1  # + 1: EOS, as decode_all's batch
            steps = cfg.decode.max_len(longest)
            decode_flops += times * cfg.decode.beam_size * train_flops(mcfg, rows, longest, steps) / 3
            calls += times * steps
    params = sum(p.numel() for p in model.parameters())
    rows, src_len, tgt_len, _ = step.shapes[0]
    return Estimate(
        label,
        jobs,
        (params, params),
        (rows, src_len, tgt_len),
        counted,
        formula,
        tc.max_steps,
        tc.max_steps * tc.grad_accum / per_epoch,
        loss_flops,
        decode_flops,
        calls,
    )


def _merged(a: Estimate, b: Estimate) -> Estimate:
    """One row for two groups of equal cost: ``norm=a`` and ``norm=b`` become ``norm=a,b``."""
    key_a, _, value_a = a.label.partition("=")
    key_b, _, value_b = b.label.partition("=")
    same_key = key_a == key_b and " " not in a.label + b.label
    label = f"{key_a}={value_a},{value_b}" if same_key else f"{a.label}; {b.label}"
    params = (min(a.params[0], b.params[0]), max(a.params[1], b.params[1]))
    return replace(a, label=label, jobs=a.jobs + b.jobs, params=params)


HEADER = (
    "jobs",
    "variant",
    "params",
    "first batch B x S x T",
    "TFLOP/step counted",
    "formula",
    "counted/formula",
    "steps (epochs)",
    "eval + decode FLOPs",
    "decoder calls",
    "per run",
    "the row's runs",
)


def _cells(e: Estimate, peak: float, mfu: float) -> list[str]:
    run_s = wall_seconds(e.run_flops, peak, mfu)
    params = "-".join(dict.fromkeys(f"{n / 1e6:.2f}" for n in e.params)) + "M"
    return [
        str(e.jobs),
        e.label or "(one setting)",
        params,
        " x ".join(map(str, e.batch)),
        f"{e.counted / 1e12:.4g}",
        f"{e.formula / 1e12:.4g}",
        f"{e.counted / e.formula:.4f}",
        f"{e.steps} ({e.epochs:.1f})",
        f"{e.eval_flops / (e.steps * e.counted):.2%} of training",
        str(e.decoder_calls),
        duration(run_s),
        duration(e.jobs * run_s),
    ]


def duration(seconds: float) -> str:
    """``42 s`` below a minute, ``2.4 min`` below an hour, else ``6.9 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def table(estimates: list[Estimate], gpu: str, mfu: float) -> str:
    """The estimates as a Markdown table, then a blank line, the sweep's total and what the numbers assume."""
    peak = PEAK_BF16_FLOPS[gpu]
    rows = [HEADER, ["---"] * len(HEADER), *(_cells(e, peak, mfu) for e in estimates)]
    jobs = sum(e.jobs for e in estimates)
    total = sum(e.jobs * wall_seconds(e.run_flops, peak, mfu) for e in estimates)
    return "\n".join(
        [
            *("| " + " | ".join(r) + " |" for r in rows),
            "",
            f"all {jobs} run{'s' * (jobs > 1)}: {duration(total)} on one {gpu}, one after another",
            f"assumed: {gpu} peak {peak / 1e12:.0f} TFLOP/s (dense bf16), MFU {mfu:g} (--mfu; an assumption, not a measurement); "
            "left out: start-up, checkpoint writes, decoding's latency",
        ]
    )
