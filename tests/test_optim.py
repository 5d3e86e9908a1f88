"""The optimizer config builds the optimizer: ``training.optim.build_optimizer`` takes the ``optim`` keys as one
``OptimConfig``, and code outside a run (benchmarks, tests) starts from the default run's (``default_optim``)."""

import re
import subprocess

import torch

from tests.helpers.config import ROOT, make_cfg
from training.optim import build_optimizer
from training.presets import default_optim
from training.schema import validate


def test_the_default_optimizer_is_the_default_runs_adamw():
    optim = default_optim()
    assert optim == validate(make_cfg()).optim  # conf/optim/adamw.yaml, as a run composes it
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    decay, no_decay = build_optimizer(model, optim).param_groups
    assert (decay["lr"], decay["betas"], decay["eps"], decay["weight_decay"]) == (2e-3, (0.9, 0.98), 1e-9, 0.01)
    assert no_decay["weight_decay"] == 0.0 and len(decay["params"]) == 1 and len(no_decay["params"]) == 3


def test_a_change_moves_only_its_key():
    changed = default_optim(lr=1e-3, weight_decay=0.1)
    assert (changed.lr, changed.weight_decay, changed.betas, changed.eps) == (1e-3, 0.1, (0.9, 0.98), 1e-9)


def test_only_training_optim_constructs_an_adamw_outside_the_tests():
    # Every other place builds it from an OptimConfig: the settings are not retyped argument lists.
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    builds = re.compile(r"torch\.optim\.AdamW\(|^from torch\.optim import .*\bAdamW\b", re.M)
    found = [f for f in files if not f.startswith("tests/") and builds.search((ROOT / f).read_text())]
    assert found == ["training/optim.py"]
