"""torchrun support: the process group from the environment, one run dir for all ranks, and the
few collectives the loop needs (only on logging steps, so a step never waits on the host).

Launch: ``torchrun --nproc_per_node=N train.py ...``. Rank 0 writes every file (logs, wandb,
checkpoints); the others train and wait at evaluations.
"""

import os
from datetime import datetime

import torch
import torch.distributed as dist

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


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
