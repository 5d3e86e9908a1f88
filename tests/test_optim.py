"""The optimizer config builds the optimizer: ``training.optim.build_optimizer`` takes the ``optim`` keys as one
``OptimConfig``, and code outside a run (benchmarks, tests) starts from the default run's (``default_optim``)."""

import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.config import ROOT, make_cfg
from training.muon_config import MuonConfig
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


def tiny_model(*overrides: str) -> torch.nn.Module:
    from model.transformer import EncoderDecoder
    from tests.helpers.config import model_config

    return EncoderDecoder(model_config(make_cfg(*overrides), 30, 30))


def decayed_names(model: torch.nn.Module, **changes) -> list[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in build_optimizer(model, default_optim(**changes)).param_groups if g["weight_decay"]
            for p in g["params"]]  # fmt: skip


def test_decay_gains_adds_every_norm_gain_to_the_decayed_parameters_and_never_a_bias():
    model = tiny_model()
    plain = decayed_names(model)
    assert all(model.get_parameter(n).dim() == 2 for n in plain)  # matrices and embeddings only, as before
    with_gains = decayed_names(model, decay_gains=True)
    norm_gains = [n for n, p in model.named_parameters() if n.endswith("norm_in.weight") or n.endswith("final_norm.weight")]
    assert len(norm_gains) == 2 * 2 + 2 * 3 + 2 and sorted(with_gains) == sorted(plain + norm_gains)
    assert not any(n.endswith("bias") for n in with_gains)
    # Zero-centred gains are decayed as their stored w (toward gain 1); under optim=muon they are AdamW's.
    offset = tiny_model("norm.gain=unit_offset")
    names = decayed_names(offset, decay_gains=True, muon=MuonConfig())
    assert sorted(n for n in names if "parametrizations" in n) == sorted(
        n.replace(".weight", ".parametrizations.weight.original") for n in norm_gains
    )


@pytest.mark.parametrize("muon", [None, MuonConfig()])
def test_eps_reaches_every_adamw_group_and_below_eps_at_step_1_is_the_share_of_gradients_under_it(muon):
    from runlog.metric_names import adam_below_eps
    from telemetry.config import TelemetryConfig
    from telemetry.recorder import Telemetry
    from tests.helpers.telemetry import batch, make

    shares = []
    for eps in (1e-9, 1e-5, 1e-3):
        for decay_gains in (False, True):  # decay is not in v: no effect on below_eps at the same gradients
            model = make()
            opt = build_optimizer(model, default_optim(eps=eps, decay_gains=decay_gains, muon=muon))
            adamw = opt.adamw if muon else opt
            assert [g["eps"] for g in adamw.param_groups] == [eps, eps]
            src, tgt_in, tgt_out = batch()
            F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=0).backward()
            grads = torch.cat([p.grad.flatten() for g in adamw.param_groups for p in g["params"]])
            opt.step()
            tele = Telemetry(model, TelemetryConfig(every=1, adam=True))
            tele.optimizer.record_adam(opt)
            below = tele.collect()[adam_below_eps().name]
            assert below == pytest.approx((grads.abs() < eps).float().mean().item(), abs=1.5 / grads.numel())
            shares.append(below)
    assert shares[0::2] == shares[1::2]  # decay_gains changes nothing here
    assert shares[0] < shares[2] < shares[4]  # a larger eps dominates more coordinates
