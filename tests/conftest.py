"""pytest's hooks and fixtures: torch threads per xdist worker, a config factory, the local SLURM cluster. The
builders test files share are in ``tests/helpers/``."""

import os

import pytest
import torch

from tests.helpers.config import make_cfg


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker, give torch (and, through OMP_NUM_THREADS, the train.py processes tests start) the
    worker's share of the cores rather than all of them, so that the workers do not oversubscribe the machine."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture
def cfg_factory():
    return make_cfg


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    """The environment of the local SLURM cluster's clients (``tests/helpers/slurm_cluster.py``); skips without SLURM."""
    from tests.helpers.slurm_cluster import start_cluster

    return start_cluster()
