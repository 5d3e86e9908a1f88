"""One run across two SLURM tasks as docs/scale.md writes it: ``srun torchrun`` (one torchrun agent per task, the c10d
rendezvous at the first host of the allocation), on the local cluster of ``scripts/slurm_local.sh``, whose one node
holds both tasks; it trains exactly as one process with twice the batch. Skipped without slurm-wlm, munge or root."""

import json
import subprocess
import sys
import uuid

import pytest

from tests.helpers.config import ROOT
from tests.helpers.distributed import DEFAULTS, ENV, assert_trains_as_one_process, free_port

pytestmark = pytest.mark.slurm

# docs/scale.md's job, with --ntasks=2 on one node for --nodes=2 --ntasks-per-node=1 (one task per "node").
JOB = """#!/bin/bash
#SBATCH --ntasks=2 --cpus-per-task=1 --mem=4G --output=job.out --error=job.err
srun {torchrun} --nnodes=$SLURM_NTASKS --nproc_per_node=1 --rdzv_backend=c10d \\
  --rdzv_endpoint=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -1):{port} --rdzv_id=$SLURM_JOB_ID \\
  {train} {overrides}
"""


def test_srun_torchrun_on_two_tasks_trains_exactly_as_one_process_with_twice_the_batch(slurm_env, tmp_path):
    run_dir, name = tmp_path / "run", f"normlab-ddp-{uuid.uuid4().hex[:8]}"
    torchrun = f"{sys.executable} -m torch.distributed.run"  # what the torchrun command runs
    overrides = " ".join([*DEFAULTS, f"hydra.run.dir={run_dir}"])
    job = JOB.format(torchrun=torchrun, port=free_port(), train=ROOT / "train.py", overrides=overrides)
    (tmp_path / "job.sh").write_text(job)
    env = {**ENV, **slurm_env}
    try:
        done = subprocess.run(["sbatch", "--wait", f"--job-name={name}", "job.sh"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:  # a job left behind by a timeout here would hold the cluster's CPUs
        subprocess.run(["scancel", f"--name={name}"], env=env, capture_output=True)
    assert done.returncode == 0, (tmp_path / "job.err").read_text()[-3000:]
    job_id = done.stdout.split()[-1]  # "Submitted batch job <id>"
    assert (tmp_path / "job.out").read_text().count("test PER") == 1  # rank 0's summary, once for the two tasks
    assert json.loads((run_dir / "status.json").read_text())["slurm"]["job_id"] == job_id

    assert_trains_as_one_process(run_dir, tmp_path, DEFAULTS, [1, 5, 10, 15, 20])
