"""Train an encoder-decoder Transformer with a chosen norm; log loss and per-layer activation scale.

    python train.py                                  # CMUdict G2P, default norm (pre-LN)
    python train.py data=multi30k model.max_len=128  # translation (data=local data.path=DIR for files)
    python train.py norm=post_ln norm.impl=native    # any axis overridable
    python train.py -m norm=post_ln,pre_ln,pre_rms seed=0,1,2
    python train.py -m +experiment=norm_ablation     # a preset sweep (conf/experiment/)
    torchrun --nproc_per_node=4 train.py             # data parallel over 4 GPUs

``train(cfg)`` is the whole run; the loop below reads top to bottom (no Trainer class).
"""

import os
import random
import resource
import signal
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from data.batching import check_budget, train_stream
from data.tokenizer import PAD_ID
from model import EncoderDecoder, ModelConfig, NormConfig
from model.telemetry import Telemetry, TelemetryConfig, first_nonfinite
from training import distributed
from training.checkpoint import LATEST, resolve_resume, rng_state, save_checkpoint, set_rng_state
from training.evaluate import evaluate_loss
from training.flops import peak_flops, train_flops
from training.interrupt import RunInterrupted, StopRequest
from training.loggers import MetricsLogger
from training.optim import build_optimizer, build_scheduler
from training.renames import renamed_override
from training.schema import validate
from training.status import DONE, read_status, write_status
from training.step import train_step
from training.sweep import in_multirun, parallel_jobs, sweep_group
from training.tasks import build_task


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or inf; the message names the step and the last good checkpoint."""


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu (``name`` is checked by ``training.schema``).
    Raises ValueError for ``cuda`` on a machine without one."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device='cuda' but no CUDA device is available; use trainer.device=cpu or auto")
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else "cpu" if name == "auto" else name)


def model_config(cfg: DictConfig, src_vocab: int, tgt_vocab: int) -> ModelConfig:
    """The typed model config from the Hydra config; raises ValueError on bad values."""
    return ModelConfig(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, pad_id=PAD_ID,
        norm=NormConfig(**OmegaConf.to_container(cfg.norm)),
        **OmegaConf.to_container(cfg.model),
    )  # fmt: skip


def config_diff(old: dict, new: dict, prefix: str = "") -> str:
    """``key: checkpoint A, this run B`` for each differing key (nested dicts joined with dots)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            if nested := config_diff(a, b, f"{prefix}{key}."):
                out.append(nested)
        elif a != b:
            out.append(f"{prefix}{key}: checkpoint {a!r}, this run {b!r}")
    return "; ".join(out)


def train(cfg: DictConfig, run_dir: Path | None = None) -> dict[str, float]:
    """Run one training job described by ``cfg``; returns the final test metrics (PER/WER for
    G2P, BLEU/chrF for translation: see ``training/tasks.py``).

    Writes into ``run_dir`` (default: Hydra's output dir; under torchrun rank 0 only):
    ``config.yaml`` (resolved), ``metrics.jsonl``, ``status.json``, ``checkpoint.pt`` (+ the
    previous one), ``src_vocab.json``, ``tgt_vocab.json``. With ``train.resume=auto`` (the
    default) a run dir that already holds a finished or diverged run is skipped, and one that
    holds an unfinished run continues from its latest good checkpoint.

    Raises:
        ValueError / FileNotFoundError: bad config values or resume path, found before training.
        NonFiniteLossError: the loss became non-finite; ``checkpoint.pt`` keeps the last finite state.
        RunInterrupted: SIGTERM or SIGINT arrived; a checkpoint of the last step was written first.
    """
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    is_main = distributed.rank() == 0
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    status = read_status(run_dir)
    if cfg.train.resume == "auto" and status.get("state") in DONE and status.get("max_steps") == cfg.trainer.max_steps:
        print(f"normlab: {run_dir} already {status['state']} at step {status['step']}; skipped (train.resume=null reruns it)")
        return status.get("test", {})
    try:
        return _train(cfg, run_dir, is_main)
    except BaseException as e:
        # A run that fails before training in a dir holding a finished run leaves that run's record
        # alone; otherwise the dir says what happened (config.yaml too, so reports list the run).
        if is_main and read_status(run_dir).get("state") not in DONE:
            state = {NonFiniteLossError: "diverged", RunInterrupted: "interrupted", KeyboardInterrupt: "interrupted"}
            write_status(run_dir, state=state.get(type(e), "failed"), error=f"{type(e).__name__}: {e}")
            (run_dir / "error.log").write_text(traceback.format_exc(), encoding="utf-8")
            if not (run_dir / "config.yaml").exists():
                OmegaConf.save(cfg, run_dir / "config.yaml")
        raise


def _train(cfg: DictConfig, run_dir: Path, is_main: bool) -> dict[str, float]:
    validate(cfg)
    tc = cfg.trainer
    device = distributed.local_device(resolve_device(tc.device))
    world = distributed.world_size()
    mcfg = model_config(cfg, src_vocab=1, tgt_vocab=1)  # validates sizes and norm now; vocab sizes come below
    tcfg = TelemetryConfig(**OmegaConf.to_container(cfg.telemetry))
    resume = resolve_resume(cfg.train.resume, run_dir)
    ckpt, resumed_from = resume if resume else (None, None)
    if ckpt and ckpt["step"] > tc.max_steps:
        raise ValueError(f"train.resume: {resumed_from} is at step {ckpt['step']}, past trainer.max_steps={tc.max_steps}; "
                         "raise trainer.max_steps to train on, or start afresh with train.resume=null")  # fmt: skip
    if is_main:
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        write_status(run_dir, state="running", max_steps=tc.max_steps, error=None)
        (run_dir / "error.log").unlink(missing_ok=True)  # an earlier attempt's, now resumed
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)

    # Data: the task's splits as token ids, vocabularies (taken from the checkpoint on resume).
    task = build_task(cfg, run_dir if is_main else None, ckpt)
    encoded = task.data
    for split in encoded.values():
        check_budget(split, tc.max_tokens)

    # Model, optimizer, schedule; on resume, their state, the data position, RNG and counters.
    mcfg = replace(mcfg, src_vocab=task.src_vocab.get_vocab_size(), tgt_vocab=task.tgt_vocab.get_vocab_size(),
                   share_embeddings=task.share_embeddings)  # fmt: skip
    if ckpt and (diff := config_diff(ckpt["model_config"], mcfg.to_dict())):
        raise ValueError(f"train.resume: {resumed_from} was trained with another model ({diff}); resume with the same one")
    model = EncoderDecoder(mcfg).to(device)
    opt = build_optimizer(model, cfg.optim.lr, tuple(cfg.optim.betas), cfg.optim.weight_decay, cfg.optim.eps)
    step, epoch, next_batch = 0, 0, 0
    counters = {"wall_s": 0.0, "tgt_tokens": 0}  # training time and tokens in this run dir, over resumes
    if ckpt:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step, (epoch, next_batch), counters = ckpt["step"], ckpt["data_position"], ckpt["counters"]
        set_rng_state(ckpt["rng"], distributed.rank(), world, device)
        if changed := config_diff(ckpt["config"], OmegaConf.to_container(cfg, resolve=True)):
            print(f"normlab: resuming {resumed_from} at step {step} with changed settings: {changed}")
    sched = build_scheduler(opt, cfg.optim.lr, cfg.schedule.warmup_steps, tc.max_steps, cfg.schedule.decay, start_step=step)
    if cfg.schedule.warmup_steps >= tc.max_steps:
        print(f"normlab: schedule.warmup_steps={cfg.schedule.warmup_steps} >= trainer.max_steps={tc.max_steps}: "
              f"the whole run warms up (to step {tc.max_steps}), no decay")  # fmt: skip
    if tc.compile:  # per layer: small graphs, quick to compile, module names unchanged
        for layer in [*model.encoder, *model.decoder]:
            layer.compile()
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    peak = peak_flops(device, tc.peak_tflops)

    def checkpoint(rngs: list) -> None:
        save_checkpoint(run_dir, {
            "config": OmegaConf.to_container(cfg, resolve=True), "model_config": mcfg.to_dict(),
            "model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
            "data_position": (epoch, next_batch), "rng": rngs, "counters": counters,
            **task.checkpoint_state(),
        })  # fmt: skip
        write_status(
            run_dir, step=step, wall_s=counters["wall_s"], tokens_per_s=counters["tgt_tokens"] / max(counters["wall_s"], 1e-9)
        )

    logger = MetricsLogger(run_dir if is_main else None, wandb_run(cfg, run_dir) if is_main else None, resume_step=step)
    telemetry = Telemetry(model, tcfg)
    print(f"normlab: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, norm {mcfg.norm.placement}/"
          f"{mcfg.norm.kind}/{mcfg.norm.impl}, device {device} x {world}, run dir {run_dir}")  # fmt: skip

    stream = train_stream(encoded["train"], tc.max_tokens, cfg.seed, epoch, next_batch,
                          rank=distributed.rank(), world=world, accum=tc.grad_accum)  # fmt: skip
    loss_sum = torch.zeros((), device=device)  # summed on the device; read only when logging
    first_bad_step = torch.full((), -1, device=device)  # first step with a non-finite loss, -1 if none
    steps_since_log, tokens_since_log, flops_since_log, t_log = 0, 0, 0.0, time.perf_counter()
    last_good = f"{resumed_from} (step {step})" if ckpt else "none written yet"
    first_bad_site = None  # first telemetry metric seen non-finite, named when the loss goes non-finite
    last_stats: dict[str, float] = {}  # latest telemetry record, drawn as a depth profile at each eval
    last_stats_step = 0  # the step it was recorded at
    model.train()
    try:
        with StopRequest() as stop, tqdm(total=tc.max_steps, initial=step, desc="train", disable=not is_main) as bar:
            while step < tc.max_steps:
                batches = next(stream)
                epoch, next_batch = batches.epoch, batches.next_batch
                micro = [b.to(device) for b in batches.micro]
                step += 1
                # Every rank records on the same steps: a rank-0-only schedule would send rank 0 alone
                # into the logging block's collectives below (a hang). Only rank 0 logs what it saw.
                record = telemetry.due(step, tc.max_steps)
                lr = sched.get_last_lr()[0]  # the rate this step's update uses (read before it steps)
                loss, grad_norm = train_step(
                    ddp, micro, opt, sched, telemetry, step_tokens=batches.n_tgt_tokens, world=world, record=record,
                    label_smoothing=tc.label_smoothing, grad_clip=tc.grad_clip, autocast=autocast,
                )  # fmt: skip
                first_bad_step = torch.where((first_bad_step < 0) & ~torch.isfinite(loss), step, first_bad_step)
                loss_sum += loss
                steps_since_log += 1
                tokens_since_log += batches.n_tgt_tokens
                flops_since_log += sum(train_flops(mcfg, B, S, T) for B, S, T, _ in batches.shapes)
                bar.update(1)

                evaluate = step % tc.eval_every == 0 or step == tc.max_steps
                save = step % tc.checkpoint_every == 0 or step == tc.max_steps
                stop_signum = stop.signum if world == 1 else 0  # under DDP the ranks agree at logging steps
                if step % tc.log_every == 0 or record or evaluate or save or stop_signum:
                    # The only host syncs of the loop: telemetry, and these scalars (reduced over ranks).
                    stats = telemetry.collect()
                    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
                    bad = distributed.all_reduce(first_bad_step.clone(), "max")
                    signum = distributed.all_reduce(torch.tensor(stop.signum, device=device), "max")
                    bad, loss_total, norm, norm_clipped, stop_signum = torch.stack(
                        [bad.float(), distributed.all_reduce(loss_sum.clone()) / world, grad_norm, clipped, signum.float()]
                    ).tolist()  # fmt: skip
                    if first_bad_site is None and (first_bad_site := first_nonfinite(stats)):
                        bar.write(f"step {step}: first non-finite telemetry value at {first_bad_site}")
                    if bad >= 0:
                        where = f"; first non-finite activation: {first_bad_site}" if first_bad_site else ""
                        raise NonFiniteLossError(f"non-finite training loss at step {int(bad)}{where}; "
                                                 f"last finite checkpoint: {last_good}")  # fmt: skip
                    elapsed = time.perf_counter() - t_log
                    counters["wall_s"] += elapsed
                    counters["tgt_tokens"] += tokens_since_log
                    metrics = {
                        "train/loss": loss_total / steps_since_log,
                        "optim/lr": lr,
                        "optim/grad_norm": norm,
                        "optim/grad_norm_clipped": norm_clipped,
                        "perf/tokens_per_s": tokens_since_log / elapsed,
                        "perf/step_ms": 1000 * elapsed / steps_since_log,
                        **({"perf/mfu": flops_since_log / elapsed / (peak * world)} if peak else {}),
                        "mem/peak_gib": peak_memory_gib(device),
                        **stats,
                    }
                    logger.log(step, metrics)
                    if stats:
                        last_stats, last_stats_step = stats, step
                    bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", lr=f"{metrics['optim/lr']:.2e}",
                                    tok_s=f"{metrics['perf/tokens_per_s']:.0f}")  # fmt: skip
                    loss_sum.zero_()
                    steps_since_log, tokens_since_log, flops_since_log = 0, 0, 0.0
                    if evaluate and is_main:
                        scores = task.evaluate(model, "valid", tc.eval_max_examples, device)
                        val = {"val/loss": evaluate_loss(model, encoded["valid"], tc.max_tokens, device)}
                        val.update({f"val/{k}": v for k, v in scores.items()})
                        logger.log(step, val)
                        logger.log_depth_profile(step, last_stats, last_stats_step)
                        bar.write(f"step {step}: val loss {val['val/loss']:.3f}, {task.describe(scores)}")
                    if save or stop_signum:  # every rank hands in its own RNG streams (a collective)
                        rngs = distributed.all_gather_object(rng_state(device))
                        if is_main:
                            checkpoint(rngs)
                            last_good = f"{run_dir / LATEST} (step {step})"
                    if stop_signum:
                        name = signal.Signals(int(stop_signum)).name
                        raise RunInterrupted(f"stopped by {name} after step {step}; checkpoint {run_dir / LATEST}; "
                                             f"continue with: {resume_command(run_dir)}", int(stop_signum))  # fmt: skip
                    t_log = time.perf_counter()  # evaluation and checkpoint time is not training throughput

        test = {}
        if is_main:
            test = {f"test/{k}": v for k, v in task.evaluate(model, "test", tc.test_max_examples, device).items()}
            logger.log(step, test)
            write_status(run_dir, state="finished", test=test)
    finally:
        logger.close()
    if is_main:
        print_summary(run_dir, mcfg, step, task.summary_rows(test, tc.test_max_examples))
    return test


def resume_command(run_dir: Path) -> str:
    """The command line that continues this run (its Hydra overrides, pointed at its run dir)."""
    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    kept = [o for o in overrides if not o.startswith(("hydra.run.dir=", "train.resume="))]
    return " ".join(["python train.py", *kept, f"hydra.run.dir={run_dir}"])


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process in GiB: CUDA max allocated, or on CPU the peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # Linux reports KiB


def wandb_run(cfg: DictConfig, run_dir: Path) -> dict | None:
    """``wandb.init`` arguments of this run (None for ``logger=none``): one wandb run per job,
    grouped by sweep, tagged with the norm axes and seed, with the resolved config."""
    if cfg.logger.name != "wandb":
        return None
    n = cfg.norm
    return {
        "project": cfg.logger.project, "entity": cfg.logger.entity, "group": cfg.logger.group or sweep_group(),
        "name": run_dir.name, "config": OmegaConf.to_container(cfg, resolve=True),
        "tags": [f"kind={n.kind}", f"impl={n.impl}", f"placement={n.placement}", f"seed={cfg.seed}"],
    }  # fmt: skip


def print_summary(run_dir: Path, mcfg: ModelConfig, step: int, metric_rows: list[tuple[str, str]]) -> None:
    rows = [
        ("run dir", str(run_dir)),
        ("norm", f"{mcfg.norm.placement} / {mcfg.norm.kind} / {mcfg.norm.impl}"),
        ("steps", str(step)),
        *metric_rows,
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    # Bad input and a diverged run are expected outcomes, not bugs: one line, no traceback. In a
    # sweep no failure stops the other jobs: the job's status.json and error.log record it, and
    # the sweep summary (training/sweep.py) lists it at the end.
    if (jobs := parallel_jobs()) > 1:  # side-by-side jobs each take their share of the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // jobs))
    try:
        train(cfg)
    except RunInterrupted as e:
        print(f"normlab: {e}", file=sys.stderr)
        sys.exit(128 + e.signum)
    except (ValueError, FileNotFoundError, NonFiniteLossError) as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        if not in_multirun():
            sys.exit(1)
    except Exception as e:
        if not in_multirun():
            raise
        print(f"normlab: job failed: {type(e).__name__}: {e} (traceback in error.log of the job dir)", file=sys.stderr)


if __name__ == "__main__":
    sys.argv = distributed.strip_local_rank(sys.argv)  # legacy launchers' --local-rank=N
    if renamed := renamed_override(sys.argv[1:]):  # Hydra's own error would not name the new key
        sys.exit(f"normlab: error: {renamed}")
    distributed.init_from_env()
    try:
        main()
    finally:
        distributed.shutdown()
