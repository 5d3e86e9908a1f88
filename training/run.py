"""What one training run holds, and the steps of train.py's loop that act on all of it: set-up
(fresh or resumed), validation, checkpointing, the final test.

``train.py`` keeps the loop itself; everything here is called from it once per run or once per
evaluation / checkpoint, never per step.
"""

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from data.batching import check_budget
from data.tokenizer import PAD_ID
from model.batch_reading import BatchReadingNorm
from model.config import ModelConfig
from model.norm_config import norm_title
from model.transformer import EncoderDecoder
from runlog.status import LAST_STEP_TESTED, write_status
from telemetry.recorder import Telemetry
from training import distributed
from training.average import AVERAGED, LastCheckpoints, remove_snapshots
from training.best import BEST, BestCheckpoint
from training.checkpoint import LATEST, ResumeRefused, config_diff, resolve_resume, save_checkpoint
from training.evaluate import evaluate_loss
from training.flops import peak_flops
from training.loggers import MetricsLogger
from training.optim import build_optimizer, build_scheduler
from training.precision import autocast, resolve_precision
from training.qk_clip import build_qk_clip
from training.schema import RunConfig
from training.spikes import RunSpikes
from training.state import Field, RankRngs, Stateful, load_state, save_state
from training.step import StepOptions
from training.sweep import sweep_group
from training.tasks import Task, build_task


@dataclass
class Run:
    """One training run: its config, where it writes, the model and everything that trains it, and the pieces a
    checkpoint carries (:meth:`pieces`)."""

    cfg: RunConfig
    run_dir: Path
    is_main: bool  # rank 0: the only rank that writes files, logs and evaluates
    device: torch.device
    world: int
    mcfg: ModelConfig
    task: Task
    model: EncoderDecoder
    opt: torch.optim.Optimizer
    telemetry: Telemetry
    step_options: StepOptions
    peak_flops: float | None  # device peak FLOP/s for MFU; None on CPU
    step: int = 0
    data_position: tuple[int, int] = (0, 0)  # (epoch, next batch) of the training stream
    counters: dict[str, float] = field(default_factory=lambda: {"wall_s": 0.0, "tgt_tokens": 0})  # over resumes
    spikes: RunSpikes = field(default_factory=RunSpikes)  # spike scores of every step so far, over resumes
    last_good: str = "none written yet"  # the checkpoint a diverged run can go back to
    best: BestCheckpoint | None = None  # trainer.test_checkpoint=best: the best validation so far (training/best.py)
    average: LastCheckpoints | None = None  # trainer.average_last: the snapshots averaged (training/average.py)
    tested: str = LAST_STEP_TESTED  # what the final test scored: status.json's ``tested``, the summary's first row
    # Built by start_run (set_off) once the pieces are loaded: the schedule is replayed to the loaded step and the
    # logger rewrites the rows past it, so neither can exist before the step is known.
    ddp: nn.Module = field(init=False)  # the model, wrapped in DistributedDataParallel when world > 1
    sched: torch.optim.lr_scheduler.LRScheduler = field(init=False)
    logger: MetricsLogger = field(init=False)

    def pieces(self) -> dict[str, Stateful | None]:
        """Each piece of this run that a checkpoint carries, under its checkpoint entry: registered here once, for
        ``save_run`` and a resume alike (``training.state``). None: a piece this run does not keep (``best``
        without ``trainer.test_checkpoint=best``), saved as None."""
        return {
            "model": self.model,
            "optimizer": self.opt,
            "rng": RankRngs(self.device, self.world),
            "step": Field(self, "step", int),
            "data_position": Field(self, "data_position", tuple),
            "counters": Field(self, "counters", dict),
            "spikes": self.spikes,
            "telemetry": self.telemetry,
            "best": self.best,
        }


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu (``name`` is checked by ``training.schema``).
    Raises ValueError for ``cuda`` on a machine without one."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device='cuda' but no CUDA device is available; use trainer.device=cpu or auto")
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else "cpu" if name == "auto" else name)


def start_run(cfg: RunConfig, run_dir: Path, is_main: bool) -> Run:
    """Build the run described by ``cfg``: data, model, optimizer, schedule,
    telemetry and logger, restored from the run dir's checkpoint when ``train.resume`` finds one.

    Nothing is written into ``run_dir`` until the checkpoint (if any) is known to fit this run.

    Raises:
        ResumeRefused: a checkpoint of weights only, one past ``trainer.max_steps``, or of another model or task.
        ValueError / FileNotFoundError: a bad resume path or checkpoint, a token budget too small for the data.
    """
    tc = cfg.trainer
    device = distributed.local_device(resolve_device(tc.device))
    precision = resolve_precision(tc.precision, device)  # what trainer.precision=auto chose: in status.json and the log
    ckpt, resumed_from = checkpoint_to_resume(cfg, run_dir)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)

    task = build_task(cfg, run_dir if is_main else None, ckpt)  # vocabularies from the checkpoint on resume
    for split in task.data.values():
        check_budget(split, tc.max_tokens)
    mcfg = sized_model_config(cfg, task)
    # The checkpoint's model config read back: keys added since it was written compare at their defaults.
    if ckpt and (diff := config_diff(ModelConfig.from_dict(ckpt["model_config"]).to_dict(), mcfg.to_dict())):
        raise ResumeRefused(f"train.resume: {resumed_from} was trained with another model ({diff}); resume with the same one")
    if is_main:  # the resume checked out: the run dir becomes this run's
        claim_run_dir(cfg, run_dir, fresh=not ckpt)
    model = EncoderDecoder(mcfg).to(device)
    if is_main:  # the report's parameter columns (analysis.runs.Run.params), and the precision config.yaml's auto chose
        write_status(run_dir, params=model.parameter_counts(), precision=precision)
    telemetry = Telemetry(model, cfg.telemetry)
    opt = build_optimizer(model, cfg.optim)
    world = distributed.world_size()
    qk_clip = build_qk_clip(model, cfg.optim.qk_clip, tc.compile)
    options = StepOptions(world, tc.label_smoothing, tc.grad_clip, autocast(precision, device), cfg.optim.z_loss, qk_clip=qk_clip)
    best = BestCheckpoint(task.spec.metric(task.spec.headline)) if tc.test_checkpoint == "best" else None
    average = LastCheckpoints(tc.average_last, tc.checkpoint_every, tc.max_steps) if tc.average_last else None
    run = Run(
        cfg,
        run_dir,
        is_main,
        device,
        world,
        mcfg,
        task,
        model,
        opt,
        telemetry,
        options,
        peak_flops(device, tc.peak_tflops),
        best=best,
        average=average,
    )
    if ckpt:
        resume(run, ckpt, resumed_from)
    if run.average and is_main:  # snapshots past the checkpoint's step, or no longer due: a straight run would not hold them
        run.average.prune(run_dir, run.step)
    set_off(run, precision)
    return run


def checkpoint_to_resume(cfg: RunConfig, run_dir: Path) -> tuple[dict[str, Any] | None, Path | None]:
    """The checkpoint ``train.resume`` finds for this run and the file it was read from, checked to fit it;
    (None, None) when there is none.

    Raises:
        ResumeRefused: a checkpoint of weights only, or one past ``trainer.max_steps``.
        ValueError / FileNotFoundError: a bad resume path or checkpoint; ranks that found different checkpoints.
    """
    ckpt, resumed_from = resolve_resume(cfg.train.resume, run_dir) or (None, None)
    # Each rank reads the checkpoint itself: a node that does not see the run dir (or sees an old copy) would train on
    # from another step, its collectives out of step with the others'.
    distributed.check_same(
        "train.resume: the checkpoint found",
        f"step {ckpt['step']}" if ckpt else "none",
        f"the run dir {run_dir} must be on a filesystem that every node sees",
    )
    if ckpt:
        refuse_unfit(ckpt, resumed_from, cfg.trainer.max_steps)
    return ckpt, resumed_from


def resume(run: Run, ckpt: dict[str, Any], resumed_from: Path) -> None:
    """Load every piece of ``run`` (:meth:`Run.pieces`) from ``ckpt``, read from ``resumed_from``, and say so.

    Raises:
        ValueError: ``ckpt`` lacks an entry of a piece (``training.state.load_state``).
    """
    load_state(run.pieces(), ckpt, resumed_from)
    run.last_good = f"{resumed_from} (step {run.step})"
    changed = config_diff(ckpt["config"], run.cfg.resolved)
    print(
        f"normlab: resuming from step {run.step} (checkpoint {resumed_from})"
        + (f" with changed settings: {changed}" if changed else "")
    )


def set_off(run: Run, precision: str) -> None:
    """What starts at ``run.step`` (0, or the loaded one): the schedule replayed to it, the model compiled and wrapped
    for DDP where asked, and the logger, which rewrites the rows past it; prints the run's one-line description."""
    cfg, tc, model = run.cfg, run.cfg.trainer, run.model
    run.sched = build_scheduler(run.opt, cfg.optim.lr, cfg.schedule, tc.max_steps, start_step=run.step)
    if cfg.schedule.warmup_steps >= tc.max_steps:
        print(
            f"normlab: schedule.warmup_steps={cfg.schedule.warmup_steps} >= trainer.max_steps={tc.max_steps}: "
            f"the whole run warms up (to step {tc.max_steps}), no decay"
        )
    if tc.compile:
        model.compile_layers()
    if run.world > 1:  # norms that read the batch take their statistics over every rank's tokens
        model.set_norm_group(torch.distributed.group.WORLD)
    ddp = run.device.index if run.device.type == "cuda" else None
    run.ddp = DistributedDataParallel(model, device_ids=[ddp] if ddp is not None else None) if run.world > 1 else model
    run.logger = MetricsLogger(
        run.run_dir if run.is_main else None, wandb_run(cfg, run.run_dir) if run.is_main else None, resume_step=run.step
    )
    print(
        f"normlab: {model.parameter_counts()['total'] / 1e6:.2f}M parameters{hyper_connection_note(model)}, norm "
        f"{norm_title(run.mcfg.norm)}, device {run.device} x {run.world}, "
        f"{precision}, run dir {run.run_dir}"
    )


def refuse_unfit(ckpt: dict[str, Any], resumed_from: Path, max_steps: int) -> None:
    """Raise ResumeRefused for a checkpoint this run cannot continue: weights only, or past ``max_steps``."""
    if "optimizer" not in ckpt:
        raise ResumeRefused(
            f"train.resume: {resumed_from} holds weights only ({BEST}: for testing and predict.py); resume from a checkpoint.pt"
        )
    if ckpt["step"] > max_steps:
        raise ResumeRefused(
            f"train.resume: {resumed_from} is at step {ckpt['step']}, past trainer.max_steps={max_steps}; "
            "raise trainer.max_steps to train on, or start afresh with train.resume=null"
        )


def claim_run_dir(cfg: RunConfig, run_dir: Path, fresh: bool) -> None:
    """Make ``run_dir`` this run's: its config.yaml and a running status; an earlier attempt's error.log goes, and a
    fresh start drops an earlier run's best checkpoint and averaging snapshots. Called only once a resume has checked
    out."""
    OmegaConf.save(cfg.resolved, run_dir / "config.yaml")
    write_status(run_dir, state="running", max_steps=cfg.trainer.max_steps, error=None)
    (run_dir / "error.log").unlink(missing_ok=True)  # an earlier attempt's, now resumed
    if fresh:
        (run_dir / BEST).unlink(missing_ok=True)  # an earlier run's, started afresh
        remove_snapshots(run_dir)


def sized_model_config(cfg: RunConfig, task: Task) -> ModelConfig:
    """``cfg.model`` sized to ``task``: its vocabulary sizes, the padding id and whether source and target share
    one embedding (a joint vocabulary). What a run's model is built from, and ``scripts/match_params.py``'s."""
    return replace(
        cfg.model,
        src_vocab=task.src_vocab.get_vocab_size(),
        tgt_vocab=task.tgt_vocab.get_vocab_size(),
        pad_id=PAD_ID,
        share_embeddings=task.share_embeddings,
    )


def hyper_connection_note(model: EncoderDecoder) -> str:
    """`` (N exactly, M of them hyper-connections (norm.hc=..., n streams); N - M with one stream)``, or "" without
    ``norm.hc``: the parameters hyper-connections add over the same model's plain residual."""
    if model.cfg.norm.hc is None:
        return ""
    counts = model.parameter_counts()
    total, hc = counts["total"], counts["hc"]
    return (
        f" ({total:,}; {hc:,} of them hyper-connections, norm.hc={model.cfg.norm.hc} over "
        f"{model.cfg.residual_streams} streams; {total - hc:,} with one plain stream)"
    )


def wandb_run(cfg: RunConfig, run_dir: Path) -> dict | None:
    """``wandb.init`` arguments of this run (None for ``logger=none``): one wandb run per job,
    grouped by sweep, tagged with the norm axes and seed, with the resolved config."""
    if cfg.logger.name != "wandb":
        return None
    n = cfg.model.norm
    return {
        "project": cfg.logger.project,
        "entity": cfg.logger.entity,
        "group": cfg.logger.group or sweep_group(),
        "name": run_dir.name,
        "config": cfg.resolved,
        "tags": [f"kind={n.kind}", f"impl={n.impl}", f"placement={n.placement}", f"seed={cfg.seed}"],
    }


def validate_run(run: Run) -> str:
    """Validation loss and the task's decoding metrics (PER/WER or BLEU/chrF) on ``valid``, logged
    at ``run.step``; rank 0 only. A model with a batch-reading norm also logs ``val/loss_batch_stats``, the loss
    with each batch's own statistics (``evaluate_loss``): minus ``val/loss``, the train/eval gap of those norms.
    Returns them as one line to print."""
    tc = run.cfg.trainer
    scores = run.task.evaluate(run.model, "valid", tc.eval_max_examples, run.device)
    val = {"val/loss": evaluate_loss(run.model, run.task.data["valid"], tc.max_tokens, run.device)}
    if any(isinstance(m, BatchReadingNorm) for m in run.model.modules()):
        val["val/loss_batch_stats"] = evaluate_loss(
            run.model, run.task.data["valid"], tc.max_tokens, run.device, batch_stats=True
        )
    val.update({f"val/{k}": v for k, v in scores.items()})
    run.logger.log(run.step, val)
    batch_stats = f" ({val['val/loss_batch_stats']:.3f} with batch statistics)" if "val/loss_batch_stats" in val else ""
    best = f"; the best so far ({BEST})" if run.best and run.best.consider(run.run_dir, run.step, scores, weights(run)) else ""
    return f"val loss {val['val/loss']:.3f}{batch_stats}, {run.task.describe(scores)}{best}"


def header(run: Run) -> dict[str, Any]:
    """What a checkpoint holds to check and rebuild the run before any piece loads (``start_run``): the resolved
    config, the model config, the task and its vocabularies."""
    return {"config": run.cfg.resolved, "model_config": run.mcfg.to_dict(), **run.task.checkpoint_state()}


def weights(run: Run) -> dict[str, Any]:
    """What a weights-only checkpoint (``best.pt``) holds besides its step: the :func:`header` and the weights."""
    return {**header(run), "model": run.model.state_dict()}


def log_init_loss(run: Run) -> None:
    """``val/loss`` at step 0, before the first update (rank 0 only): the loss at initialization, l0 of the LR
    sensitivity (Wortsman et al. 2023, §2.2; ``analysis/lrs.py``). No RNG is drawn, so training is unchanged."""
    run.logger.log(0, {"val/loss": evaluate_loss(run.model, run.task.data["valid"], run.cfg.trainer.max_tokens, run.device)})


def save_run(run: Run) -> None:
    """Checkpoint the run (rank 0 writes; every rank hands in its own RNG streams, a collective, so
    every rank calls this on the same steps) and record its progress in ``status.json`` (step, time,
    throughput, spike scores so far: the last checkpoint, at ``trainer.max_steps``, holds the run's)."""
    state = save_state(run.pieces())  # on every rank: the rng piece gathers every rank's streams
    if not run.is_main:
        return
    if run.average:  # before checkpoint.pt: a kill between the two leaves a snapshot the resumed run writes again
        run.average.save(run.run_dir, run.step, weights(run))
    save_checkpoint(run.run_dir, {**header(run), **state})
    wall, tokens = run.counters["wall_s"], run.counters["tgt_tokens"]
    write_status(run.run_dir, step=run.step, wall_s=wall, tokens_per_s=tokens / max(wall, 1e-9), **run.spikes.status())
    run.last_good = f"{run.run_dir / LATEST} (step {run.step})"


def final_test(run: Run) -> dict[str, float]:
    """The final test metrics (rank 0 decodes; other ranks return ``{}``), logged and written to
    ``status.json`` with state ``finished`` and what was ``tested``; with ``trainer.test_checkpoint=best`` of the best
    validation checkpoint's weights (``best.pt``), with ``trainer.average_last`` of the average of the last
    checkpoints' (``training/average.py``; also written to ``averaged.pt``): either stays in the model."""
    if not run.is_main:
        return {}
    if run.best:  # trainer.test_checkpoint=best; the last step's weights stay in checkpoint.pt
        run.model.load_state_dict(run.best.weights(run.run_dir))
        run.tested = f"the best validation checkpoint: step {run.best.step}, {run.best.metric.text(run.best.value)}"
        write_status(run.run_dir, best=run.best.record())
    if run.average:  # trainer.average_last (never with best: training.schema)
        averaged, run.tested = run.average.average(run.run_dir, run.step)
        run.model.load_state_dict(averaged)
        run.average.write_average(run.run_dir, weights(run), run.step, run.tested)
    if run.best or run.average:
        print(f"normlab: testing {run.tested} ({run.run_dir / (BEST if run.best else AVERAGED)})")
    scores = run.task.evaluate(run.model, "test", run.cfg.trainer.test_max_examples, run.device)
    test = {f"test/{k}": v for k, v in scores.items()}
    run.logger.log(run.step, test)
    write_status(run.run_dir, state="finished", test=test, tested=run.tested)
    return test
