"""torchrun support: the process group from the environment, one run dir for all ranks, and the
few collectives the loop needs (only on logging steps, so a step never waits on the host).

Launch: ``torchrun --nproc_per_node=N train.py ...`` (one node) or ``torchrun --nnodes=M ... --rdzv_backend=c10d``
(several). Rank 0 writes every file (logs, wandb, checkpoints, Hydra's own); the others train and wait at evaluations.
Nothing here reads ``LOCAL_RANK`` but the GPU choice: on every node but one there is a local rank 0 that is not rank 0.
"""

import os
from datetime import datetime
from typing import Any

import torch
import torch.distributed as dist
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write

STAMP_ENV = "NORMLAB_RUN_STAMP"  # read by hydra.run.dir in conf/config.yaml
LOCAL_RANK_FLAGS = ("--local-rank", "--local_rank")


def strip_local_rank(argv: list[str]) -> list[str]:
    """``argv`` without the ``--local-rank=N`` / ``--local_rank N`` flag that legacy launchers
    (``python -m torch.distributed.launch`` without ``--use-env``, DeepSpeed's) append. The flag
    only repeats ``LOCAL_RANK``, which is set from it when the launcher did not export it; Hydra
    would reject it as an unrecognized argument."""
    out, i = [], 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag in LOCAL_RANK_FLAGS:
            if not eq:  # "--local-rank N": the value is the next argument
                i += 1
                value = argv[i] if i < len(argv) else ""
            os.environ.setdefault("LOCAL_RANK", value)
        else:
            out.append(argv[i])
        i += 1
    return out


def init_from_env() -> None:
    """Under torchrun (``WORLD_SIZE`` > 1): start the process group (NCCL on CUDA, else gloo),
    pin this rank's GPU, and publish rank 0's start time in ``$NORMLAB_RUN_STAMP`` so every
    rank's Hydra run dir is the same directory. A no-op in a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    stamp = [datetime.now().strftime("%Y-%m-%d/%H-%M-%S")]
    dist.broadcast_object_list(stamp, src=0)
    os.environ[STAMP_ENV] = stamp[0]


class RankZeroHydraFiles(Callback):
    """Hydra's own files in the run dir, ``.hydra/`` and the job log ``train.log``, written by rank 0 alone like
    every other file of the run; the other ranks keep ``hydra.job_logging`` without its file handlers (by default:
    their stdout). Hydra alone has every rank write them into the one shared dir: on a filesystem shared by
    several nodes, several hosts appending to one file. A no-op in a single process; registered in conf/config.yaml."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if rank() == 0:
            return
        # Hydra's run_job reads both after this callback, from this same config (and turns an exception raised
        # here into a warning).
        logging = OmegaConf.to_container(config.hydra.job_logging)  # interpolations kept, resolved by Hydra
        assert isinstance(logging, dict)  # a logging config is a mapping
        handlers = logging.get("handlers") or {}
        files = {name for name, handler in handlers.items() if "filename" in handler}
        with read_write(config.hydra):
            config.hydra.output_subdir = None
            if not files:
                return
            logging["handlers"] = {name: handler for name, handler in handlers.items() if name not in files}
            for logger in [logging.get("root"), *(logging.get("loggers") or {}).values()]:
                if logger and logger.get("handlers"):
                    logger["handlers"] = [name for name in logger["handlers"] if name not in files]
            config.hydra.job_logging = logging


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def local_device(device: torch.device) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` under torchrun on CUDA, else ``device``."""
    if device.type == "cuda" and dist.is_initialized():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``t`` reduced over ranks (``sum`` or ``max``), in place; unchanged in a single process."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t


def all_gather_object(obj: object) -> list[object]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (pickled; for small, rare payloads such
    as RNG states at checkpoints); ``[obj]`` in a single process."""
    if not dist.is_initialized():
        return [obj]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def check_same(what: str, value: object, hint: str) -> None:
    """Raise ValueError when the ranks hold different ``value``s (compared with ``==``): ``"<what> differs between
    ranks (rank 0: <value>, rank 1: ...); <hint>"``. A collective: every rank calls it; a no-op in a single process."""
    values = all_gather_object(value)
    if any(v != values[0] for v in values):
        ranks = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise ValueError(f"{what} differs between ranks ({ranks}); {hint}")


def wait_for_all() -> None:
    """Every rank waits here until all have arrived (a barrier, bounded by the process group's timeout like any
    collective); a no-op in a single process."""
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
