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

# OpenMP threads that wait for work spin 10,000 rounds before they sleep, not libgomp's 300,000: beside other busy
# processes long spins took the CPU from the threads with work (a run 2.6-3.4x slower), while sleeping at once
# (OMP_WAIT_POLICY=PASSIVE) cost ~20 % on a quiet machine (docs/benchmarks.md, "Threads"). libgomp reads it once, when
# torch loads it: so before torch. A policy or spin count the user set wins.
if not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & os.environ.keys():
    os.environ["GOMP_SPINCOUNT"] = "10000"

import signal
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from data.batching import train_stream
from model.config import ModelConfig
from model.norm_config import norm_title
from runlog.lock import RunDirBusy, run_dir_lock
from runlog.status import DONE, read_status, write_status
from training import distributed, slurm
from training.checkpoint import LATEST, ResumeRefused, finished_run_changes
from training.cli import check_args, register_resolvers, resume_command
from training.flops import train_flops
from training.interrupt import NonFiniteLossError, RunInterrupted, StartUpSigint, StopRequest, read_stop, request_stop
from training.optim import scheduled_lr
from training.progress import Progress
from training.schema import RunConfig, validate
from training.step import train_step
from training.sweep import in_multirun, parallel_jobs, sweep_stop_file

if TYPE_CHECKING:  # training.run loads datasets and sacrebleu (seconds): _train imports it once the config checks out
    from training.run import Run


def train(cfg: DictConfig, run_dir: Path | None = None) -> dict[str, float]:
    """Run one training job described by ``cfg``; returns the final test metrics (PER/WER for
    G2P, BLEU/chrF for translation: see ``training/tasks/``).

    Writes into ``run_dir`` (default: Hydra's output dir; under torchrun rank 0 only):
    ``config.yaml`` (resolved), ``metrics.jsonl``, ``status.json``, ``checkpoint.pt`` (+ the
    previous one), ``src_vocab.json``, ``tgt_vocab.json``, ``task.json`` (the task's metric spec), and holds
    ``.lock`` while it runs (``runlog/lock.py``). With ``train.resume=auto`` (the default) a run dir that already
    holds a finished or diverged run of the same model and norm is skipped (one line names any other setting that
    differs), and one that holds an unfinished run continues from its latest good checkpoint.

    ``cfg`` is checked and typed once (``training.schema.validate``); nothing below reads it.

    Raises:
        ValueError / FileNotFoundError: bad config values or resume path, found before training.
        ResumeRefused: (a ValueError) the run dir's checkpoint or finished run cannot be continued by this config
            (another model, norm or task, a step past ``trainer.max_steps``); the run dir is left as it was.
        RunDirBusy: another living run holds ``run_dir``; nothing is written.
        NonFiniteLossError: the loss became non-finite; ``checkpoint.pt`` keeps the last finite state.
        RunInterrupted: SIGTERM or SIGINT (or, in a submitit job on SLURM, its requeue signal USR2) arrived; a
            checkpoint of the last step was written first. During the final test it stops the test at once
            (``status.json``: ``interrupted``, its error naming the final test); a resume tests again.
    """
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    is_main = distributed.rank() == 0
    if not is_main:
        return _attempt(cfg, run_dir, is_main)
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_dir_lock(run_dir):  # a second run on this dir stops here, before it writes anything
        return _attempt(cfg, run_dir, is_main)


def _attempt(cfg: DictConfig, run_dir: Path, is_main: bool) -> dict[str, float]:
    """``train``'s work once the run dir is held: skip a finished run, else train, recording how it ended."""
    status = read_status(run_dir)
    if cfg.train.resume == "auto" and status.get("state") in DONE and status.get("max_steps") == cfg.trainer.max_steps:
        changed = finished_run_changes(run_dir, cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True)))
        print(
            f"normlab: {run_dir} already {status['state']} at step {status['step']}; skipped (train.resume=null reruns it)"
            + (f"; this run's settings differ from it: {changed}" if changed else "")
        )
        return status.get("test", {})
    if is_main and (job := slurm.job_record()):  # which SLURM job, and how many requeues, this attempt is
        write_status(run_dir, slurm=job)
    try:
        try:
            return _train(validate(cfg), run_dir, is_main)
        except KeyboardInterrupt as e:  # Ctrl-C outside a training step (start-up) or a second one
            raise RunInterrupted(f"stopped by SIGINT; {resume_hint(run_dir)}", signal.SIGINT) from e
    except BaseException as e:
        # A run that fails before training in a dir holding a finished run leaves that run's record
        # alone, and so does a refused resume (its dir stays as it was); otherwise the dir says what
        # happened (config.yaml too, so reports list the run).
        if is_main and not isinstance(e, ResumeRefused) and read_status(run_dir).get("state") not in DONE:
            diverged = {"diverged_step": e.step} if isinstance(e, NonFiniteLossError) else {}
            write_status(run_dir, state=ended_as(e), error=f"{type(e).__name__}: {e}", **diverged)
            (run_dir / "error.log").write_text(traceback.format_exc(), encoding="utf-8")
            if not (run_dir / "config.yaml").exists():
                OmegaConf.save(cfg, run_dir / "config.yaml")
        raise


def ended_as(e: BaseException) -> str:
    """The state a run that raised ``e`` ended in (``status.json``'s ``state``, the wandb run's ``run/state``)."""
    states = {NonFiniteLossError: "diverged", RunInterrupted: "interrupted", KeyboardInterrupt: "interrupted"}
    return states.get(type(e), "failed")


def _train(cfg: RunConfig, run_dir: Path, is_main: bool) -> dict[str, float]:
    # Imported once the config has checked out: the data and evaluation code loads datasets and sacrebleu
    # (seconds), so a bad override (training.schema) is reported without waiting for them.
    with StartUpSigint(keep=(ResumeRefused,)):  # a Ctrl-C here stays one, whatever error CPython turns it into
        from training.run import log_init_loss, save_run, start_run, validate_run
        from training.window import LogWindow

        run = start_run(cfg, run_dir, is_main)
    tc = cfg.trainer
    shard = {"rank": distributed.rank(), "world": run.world, "accum": tc.grad_accum}  # this rank's share of each step
    stream = train_stream(run.task.data["train"], tc.max_tokens, cfg.seed, *run.data_position, **shard)
    window = LogWindow(run.device, z_loss=run.step_options.z_loss > 0)
    run.model.train()
    try:
        if run.step == 0 and is_main:
            log_init_loss(run)
        bar = Progress(tc.max_steps, run.step, disable=not is_main)
        with StopRequest(sweep_stop_file()) as stop, bar:
            while run.step < tc.max_steps:
                batches = next(stream)
                run.step, run.data_position = run.step + 1, (batches.epoch, batches.next_batch)
                # Every rank records on the same steps: a rank-0-only schedule would send rank 0 alone
                # into the logging block's collectives below (a hang). Only rank 0 logs what it saw.
                record = run.telemetry.due(run.step, tc.max_steps)
                lr = scheduled_lr(run.opt)  # optim.lr as this step's update uses it (read before the schedule steps)
                options = replace(run.step_options, step_tokens=batches.n_tgt_tokens, record=record)
                micro = [b.to(run.device) for b in batches.micro]
                result = train_step(run.ddp, micro, run.opt, run.sched, run.telemetry, options)
                flops = sum(train_flops(run.mcfg, *s[:3]) for s in batches.shapes)
                window.add(run.step, result, batches.n_tgt_tokens, flops)
                bar.step(lr)

                evaluate = run.step % tc.eval_every == 0 or run.step == tc.max_steps
                save = run.step % tc.checkpoint_every == 0 or run.step == tc.max_steps
                signum = stop.signum if run.world == 1 else 0  # under DDP the ranks agree at logging steps
                if not (run.step % tc.log_every == 0 or record or evaluate or save or signum):
                    continue
                metrics, signum = window.close(run, lr, stop.signum)
                run.logger.log(run.step, metrics)
                bar.logged(run.step, metrics)
                if evaluate and is_main:
                    bar.write(f"step {run.step}: {validate_run(run)}")
                    run.logger.log_depth_profile(run.step, window.record, window.record_step)
                if save or signum:
                    save_run(run)
                if signum:
                    raise _stopped(signum, f"after step {run.step}; checkpoint {run_dir / LATEST}", run_dir)
                window.restart()
            if stop.signum and run.world == 1:  # it came after the last step's check: the checkpoint holds that step
                raise _stopped(stop.signum, "after the last step, before the final test", run_dir)
        test = _final_test(run)
    except BaseException as e:
        run.logger.close(ended_as(e))
        raise
    run.logger.close()
    if is_main:
        print_summary(run_dir, run.mcfg, run.step, [("tested", run.tested), *run.task.summary_rows(test, tc.test_max_examples)])
    return test


def _stopped(signum: int, when: str, run_dir: Path) -> RunInterrupted:
    """The error that ends a run a signal stopped ``when`` (a checkpoint holds the last step), saying how to continue."""
    name = signal.Signals(signum).name
    return RunInterrupted(f"stopped by {name} {when}; continue with: {resume_command(run_dir)}", signum)


def _final_test(run: "Run") -> dict[str, float]:
    """``final_test``'s metrics. It only reads the model (checkpoint.pt holds the last step): a signal stops it at once,
    and a resume tests again."""
    from training.run import final_test

    with StopRequest(at_once=f"during the final test; {resume_hint(run.run_dir)}"):
        test = final_test(run)
        # The other ranks wait for rank 0's test: a rank that tore its gloo group down while rank 0 was still
        # validating aborted (SIGABRT, "terminate called without an active exception") in a CI run.
        distributed.wait_for_all()
    return test


def resume_hint(run_dir: Path) -> str:
    """How to go on with a run stopped outside a training step: from its checkpoint, or afresh."""
    if not (run_dir / LATEST).is_file():
        return f"nothing to resume (no checkpoint yet); rerun with: {resume_command(run_dir)}"
    return f"checkpoint {run_dir / LATEST} (step {read_status(run_dir).get('step')}); continue with: {resume_command(run_dir)}"


def print_summary(run_dir: Path, mcfg: ModelConfig, step: int, metric_rows: list[tuple[str, str]]) -> None:
    rows = [
        ("run dir", str(run_dir)),
        ("norm", norm_title(mcfg.norm)),
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
    # A stopped sweep (training/sweep.py) starts no further job, and its stopped jobs return to it.
    stop = None
    try:
        if signum := read_stop(stop := sweep_stop_file()):
            print(
                f"normlab: sweep stopped by {signal.Signals(signum).name}; {HydraConfig.get().runtime.output_dir} not started",
                file=sys.stderr,
            )
            return
        if (jobs := parallel_jobs()) > 1:  # side-by-side jobs each take their share of the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // jobs))
        train(cfg)
    except KeyboardInterrupt:  # a Ctrl-C before train() holds its run dir (inside it, train() makes it RunInterrupted)
        hint = resume_hint(Path(HydraConfig.get().runtime.output_dir))
        stopped(RunInterrupted(f"stopped by SIGINT; {hint}", signal.SIGINT), stop or sweep_stop_file())
    except RunInterrupted as e:
        stopped(e, stop)
    except (ValueError, FileNotFoundError, NonFiniteLossError, RunDirBusy) as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        if not in_multirun():
            sys.exit(1)
    except Exception as e:
        if not in_multirun():
            raise
        print(f"normlab: job failed: {type(e).__name__}: {e} (traceback in error.log of the job dir)", file=sys.stderr)


def stopped(e: RunInterrupted, stop: Path | None) -> None:
    """Say how a run stopped by a signal goes on; then SLURM's requeue signal hands the job to submitit, a stopped job of
    a local sweep tells its sweep (which starts no further job), and a single run exits with status 128 + signal."""
    print(f"normlab: {e}", file=sys.stderr)
    if e.signum == slurm.requeue_signal():
        requeue_or_say_why(e)  # returns when submitit does not requeue the job
        return
    if stop is None:
        sys.exit(128 + e.signum)
    request_stop(stop, e.signum)


def requeue_or_say_why(e: RunInterrupted) -> None:
    """SLURM's time-limit warning stopped this submitit job at a checkpoint: submitit requeues it and exits (the requeued
    job resumes from the checkpoint). When submitit will not (``max_num_timeout`` timeouts already), the job's
    ``status.json`` says why (state ``failed``, which the sweep summary lists) and the job returns to its sweep, which
    goes on."""
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    reason = slurm.requeue(e.signum)  # exits when it requeues
    if reason is None:  # a task other than rank 0: rank 0 requeues the job
        sys.exit(128 + e.signum)
    limit = hc.launcher.get("max_num_timeout")
    reason = reason.removeprefix("Job not requeued because: ").rstrip(".")
    error = f"not requeued: {reason} (hydra.launcher.max_num_timeout={limit}); {e}"
    print(f"normlab: {error}", file=sys.stderr)
    if distributed.rank() == 0:
        write_status(run_dir, state="failed", error=error)


if __name__ == "__main__":
    sys.argv = distributed.strip_local_rank(sys.argv)  # legacy launchers' --local-rank=N
    check_args(sys.argv[1:])  # mistakes whose Hydra error would not say what to write instead
    register_resolvers()
    # A SLURM job (hydra/launcher=slurm) starts in the submitting dir and unpickles this repo's functions: it finds
    # them through PYTHONPATH, which sbatch passes on, wherever train.py was started from.
    paths = [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    distributed.init_from_env()
    try:
        main()
    except KeyboardInterrupt:  # a Ctrl-C in Hydra's own start-up, before main() runs: one line, no traceback
        print("normlab: stopped by SIGINT before the run started; rerun the same command", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    finally:
        distributed.shutdown()
