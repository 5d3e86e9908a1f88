"""Train an encoder-decoder Transformer with a chosen norm; log loss and per-layer activation scale.

    python train.py                                  # CMUdict G2P, default norm (pre-LN)
    python train.py data=multi30k model.max_len=128  # translation (data=local data.path=DIR for files)
    python train.py norm=post_ln norm.impl=native    # any axis overridable
    python train.py -m norm=post_ln,pre_ln,pre_rms seed=0,1,2

``train(cfg)`` is the whole run; the loop below reads top to bottom (no Trainer class).
"""

import random
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from data.batching import check_budget, train_stream
from data.tokenizer import PAD_ID
from model import EncoderDecoder, ModelConfig, NormConfig
from model.telemetry import Telemetry, TelemetryConfig, first_nonfinite
from training.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from training.evaluate import evaluate_loss
from training.loggers import MetricsLogger
from training.optim import build_optimizer, build_scheduler
from training.step import train_step
from training.tasks import build_task
from training.validate import check_run_config

DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("wandb", "none")


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or inf; the message names the step and the last good checkpoint."""


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu. Raises ValueError for unknown or unavailable devices."""
    if name not in DEVICES:
        raise ValueError(f"unknown trainer.device {name!r}; valid: {', '.join(DEVICES)}")
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

    Writes into ``run_dir`` (default: Hydra's output dir): ``config.yaml`` (resolved),
    ``metrics.jsonl``, ``checkpoint.pt``, ``src_vocab.json``, ``tgt_vocab.json``.

    Raises:
        ValueError / FileNotFoundError: bad config values or resume path, found before training.
        NonFiniteLossError: the loss became non-finite; ``checkpoint.pt`` keeps the last finite state.
    """
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    tc = cfg.trainer
    check_run_config(cfg)
    if cfg.logger.name not in LOGGERS:
        raise ValueError(f"unknown logger {cfg.logger.name!r}; valid: {', '.join(LOGGERS)}")
    device = resolve_device(tc.device)
    mcfg = model_config(cfg, src_vocab=1, tgt_vocab=1)  # validates sizes and norm now; vocab sizes come below
    tcfg = TelemetryConfig(**OmegaConf.to_container(cfg.telemetry))
    resume = load_checkpoint(cfg.train.resume) if cfg.train.resume else None
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)

    # Data: the task's splits as token ids, vocabularies (taken from the checkpoint on resume).
    task = build_task(cfg, run_dir, resume)
    encoded = task.data
    for split in encoded.values():
        check_budget(split, tc.max_tokens)

    # Model, optimizer, schedule; on resume, all of their state and the data position.
    mcfg = replace(mcfg, src_vocab=task.src_vocab.get_vocab_size(), tgt_vocab=task.tgt_vocab.get_vocab_size(),
                   share_embeddings=task.share_embeddings)  # fmt: skip
    if resume and (diff := config_diff(resume["model_config"], mcfg.to_dict())):
        raise ValueError(f"train.resume: the checkpoint was trained with other settings ({diff}); resume with the same ones")
    model = EncoderDecoder(mcfg).to(device)
    opt = build_optimizer(model, cfg.optim.lr, tuple(cfg.optim.betas), cfg.optim.weight_decay, cfg.optim.eps)
    sched = build_scheduler(opt, cfg.schedule.warmup_steps, tc.max_steps, cfg.schedule.decay)
    if cfg.schedule.warmup_steps > tc.max_steps:
        print(f"normlab: schedule.warmup_steps={cfg.schedule.warmup_steps} > trainer.max_steps={tc.max_steps}: "
              f"warmup cut to {tc.max_steps} steps, no decay")  # fmt: skip
    step, epoch, batch_no = 0, 0, 0
    if resume:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        sched.load_state_dict(resume["scheduler"])
        step, (epoch, batch_no) = resume["step"], resume["data_position"]
        set_rng_state(resume["rng"])
    n_params = sum(p.numel() for p in model.parameters())
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()

    def checkpoint(epoch: int, batch_no: int) -> None:
        save_checkpoint(run_dir / "checkpoint.pt", {
            "model_config": mcfg.to_dict(), "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "step": step, "data_position": (epoch, batch_no), "rng": rng_state(),
            **task.checkpoint_state(),
        })  # fmt: skip

    wandb_run = None
    if cfg.logger.name == "wandb":
        n = cfg.norm
        wandb_run = {
            "project": cfg.logger.project, "entity": cfg.logger.entity, "group": cfg.logger.group,
            "name": run_dir.name, "config": OmegaConf.to_container(cfg, resolve=True),
            "tags": [f"kind={n.kind}", f"impl={n.impl}", f"placement={n.placement}", f"seed={cfg.seed}"],
        }  # fmt: skip
    logger = MetricsLogger(run_dir, wandb_run)
    telemetry = Telemetry(model, tcfg)
    print(f"normlab: {n_params / 1e6:.2f}M parameters, norm {mcfg.norm.placement}/{mcfg.norm.kind}/{mcfg.norm.impl}, "
          f"device {device}, run dir {run_dir}")  # fmt: skip

    stream = train_stream(encoded["train"], tc.max_tokens, cfg.seed, epoch, batch_no)
    loss_sum = torch.zeros((), device=device)  # summed on the device; read only when logging
    first_bad_step = torch.full((), -1, device=device)  # first step with a non-finite loss, -1 if none
    steps_since_log, tokens_since_log, t_log = 0, 0, time.perf_counter()
    last_good = f"{run_dir / 'checkpoint.pt'} (step {step})" if resume else "none written yet"
    first_bad_site = None  # first telemetry metric seen non-finite, named when the loss goes non-finite
    last_stats: dict[str, float] = {}  # latest telemetry record, drawn as a depth profile at each eval
    model.train()
    try:
        with tqdm(total=tc.max_steps, initial=step, desc="train", dynamic_ncols=True) as bar:
            while step < tc.max_steps:
                epoch, batch_no, batch = next(stream)
                batch = batch.to(device)
                step += 1
                record = telemetry.due(step, tc.max_steps)
                loss, grad_norm = train_step(
                    model, batch, opt, sched, telemetry, record=record,
                    label_smoothing=tc.label_smoothing, grad_clip=tc.grad_clip, autocast=autocast,
                )  # fmt: skip
                first_bad_step = torch.where((first_bad_step < 0) & ~torch.isfinite(loss), step, first_bad_step)
                loss_sum += loss
                steps_since_log += 1
                tokens_since_log += batch.n_tgt_tokens
                bar.update(1)

                evaluate = step % tc.eval_every == 0 or step == tc.max_steps
                if step % tc.log_every == 0 or record or evaluate:
                    # Two device-to-host transfers per logging step: telemetry, and these scalars.
                    stats = telemetry.collect()
                    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
                    bad, loss_total, norm, norm_clipped = torch.stack(
                        [first_bad_step.float(), loss_sum, grad_norm, clipped]).tolist()  # fmt: skip
                    if first_bad_site is None and (first_bad_site := first_nonfinite(stats)):
                        bar.write(f"step {step}: first non-finite telemetry value at {first_bad_site}")
                    if bad >= 0:
                        where = f"; first non-finite activation: {first_bad_site}" if first_bad_site else ""
                        raise NonFiniteLossError(f"non-finite training loss at step {int(bad)}{where}; "
                                                 f"last finite checkpoint: {last_good}")  # fmt: skip
                    elapsed = time.perf_counter() - t_log
                    metrics = {
                        "train/loss": loss_total / steps_since_log,
                        "optim/lr": sched.get_last_lr()[0],
                        "optim/grad_norm": norm,
                        "optim/grad_norm_clipped": norm_clipped,
                        "perf/tokens_per_s": tokens_since_log / elapsed,
                        "perf/step_ms": 1000 * elapsed / steps_since_log,
                        **stats,
                    }
                    logger.log(step, metrics)
                    last_stats = stats or last_stats
                    bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", lr=f"{metrics['optim/lr']:.2e}",
                                    tok_s=f"{metrics['perf/tokens_per_s']:.0f}")  # fmt: skip
                    loss_sum.zero_()
                    steps_since_log, tokens_since_log = 0, 0
                    if evaluate:
                        scores = task.evaluate(model, "valid", tc.eval_max_examples, device)
                        val = {"val/loss": evaluate_loss(model, encoded["valid"], tc.max_tokens, device)}
                        val.update({f"val/{k}": v for k, v in scores.items()})
                        logger.log(step, val)
                        logger.log_depth_profile(step, last_stats)
                        bar.write(f"step {step}: val loss {val['val/loss']:.3f}, {task.describe(scores)}")
                        checkpoint(epoch, batch_no + 1)
                        last_good = f"{run_dir / 'checkpoint.pt'} (step {step})"
                    t_log = time.perf_counter()  # evaluation time is not training throughput

        test = {f"test/{k}": v for k, v in task.evaluate(model, "test", tc.test_max_examples, device).items()}
        logger.log(step, test)
    finally:
        logger.close()
    print_summary(run_dir, mcfg, step, task.summary_rows(test, tc.test_max_examples))
    return test


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
    # Bad input and a diverged run are expected outcomes, not bugs: one line, no traceback.
    try:
        train(cfg)
    except (ValueError, FileNotFoundError, NonFiniteLossError) as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
