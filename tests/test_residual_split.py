"""Issue 39 item 6: the residual mechanisms split into ``Residual`` (the placement plan), ``GPASResidual``
(``norm.gpas``) and ``HyperResidual`` (``norm.hc``) compute what the one ``Residual`` computed before.

PINNED was recorded from commit 3fc44e4 (before the split) with this file's ``fingerprint``; on the recording
machine the split's outputs, gradients and state dicts were equal bit for bit (torch.equal) for every placement with
and without GPAS and every hyper-connection kind at each placement that admits one. The comparison here allows
1e-6 relative: float32 sums differ by CPU's BLAS (tests/test_norm_plans.py), a change of formula moves them far more.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig, NormConfig
from model.gpas import GPASResidual
from model.hyper_residual import HyperResidual
from model.norms import build_norm
from model.placements import ResidualPlan
from model.residual import Residual
from model.transformer import EncoderDecoder

V = 20

# config name: float64 (loss, sum of logits, sum of squared gradients), from ``fingerprint(build(CONFIGS[name]))``
PINNED = {
    "pre": (3.795846462249756, 82.31604144535959, 31.37034366921941),
    "post": (3.465705633163452, 20.873208419419825, 37.810109183468704),
    "sandwich": (3.6913585662841797, 92.88809866970405, 34.43462950472036),
    "deepnorm": (4.124098777770996, 60.08238480333239, 9.291049842988707),
    "hybrid": (3.580204486846924, 32.97485937131569, 27.591384553992736),
    "b2t": (4.114713668823242, 35.537321569398046, 8.324719445261989),
    "lns": (3.948361873626709, 76.12588802818209, 16.977904444665214),
    "layerscale": (3.3965001106262207, 11.602972589898854, 15.880396583462256),
    "pre_gpas": (3.2230331897735596, -31.648234103806317, 65291.69248012337),
    "deepnorm_gpas": (4.096527099609375, 64.39959428552538, 18663.67148095716),
    "b2t_gpas": (4.056087970733643, 32.19961084227543, 455.6982257594511),
    "mix_ln_gpas": (3.3728952407836914, -23.866693320684135, 79368.59055016648),
    "pre_hc_static": (3.7958481311798096, 82.31609723693691, 32.69195221661661),
    "lns_hc_dynamic": (3.9483642578125, 76.12597931595519, 17.45470865721007),
    "sandwich_hc_mhc": (3.9761366844177246, 48.08180469926447, 77.80586376765774),
}

CONFIGS = {
    "pre": {"placement": "pre"},
    "post": {"placement": "post"},
    "sandwich": {"placement": "sandwich"},
    "deepnorm": {"placement": "deepnorm"},
    "hybrid": {"placement": "hybrid", "qk": "layernorm", "v": "layernorm"},
    "b2t": {"placement": "b2t"},
    "lns": {"placement": "lns"},
    "layerscale": {"placement": "layerscale"},
    "pre_gpas": {"placement": "pre", "gpas": True},
    "deepnorm_gpas": {"placement": "deepnorm", "gpas": True},
    "b2t_gpas": {"placement": "b2t", "gpas": True},
    "mix_ln_gpas": {"placement": "mix_ln", "gpas": True, "mix_ln_alpha": 0.5},
    "pre_hc_static": {"placement": "pre", "hc": "static"},
    "lns_hc_dynamic": {"placement": "lns", "hc": "dynamic"},
    "sandwich_hc_mhc": {"placement": "sandwich", "hc": "mhc"},
}


def build(norm: dict) -> EncoderDecoder:
    """Seed 0, D 16, 2 + 3 layers, dropout 0.1; every GPAS and branch gate set away from its init (0.3, 0.4, ...), so
    a change of where they act shows."""
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=V, tgt_vocab=V, d_model=16, n_heads=2, d_ff=32, n_enc_layers=2, n_dec_layers=3,
                      dropout=0.1, norm=NormConfig(kind="layernorm", **norm))  # fmt: skip
    model = EncoderDecoder(cfg)
    with torch.no_grad():
        gates = [p for name, p in model.named_parameters() if name.endswith(("gpas.gate", ".gate.weight"))]
        for i, p in enumerate(gates):
            p.fill_(0.3 + 0.1 * i)
    return model


def fingerprint(model: EncoderDecoder) -> tuple[float, float, float]:
    """The cross-entropy on a fixed padded batch in training mode (dropout seeded), the sum of its logits and the
    sum of its squared gradients, float64."""
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, V, (2, 7), generator=g), torch.randint(4, V, (2, 6), generator=g)
    src[1, 5:], tgt[1, 4:] = 0, 0
    torch.manual_seed(2)
    logits = model(src, tgt[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0)
    loss.backward()
    grads = sum(p.grad.double().pow(2).sum().item() for p in model.parameters() if p.grad is not None)
    return loss.item(), logits.double().sum().item(), grads


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_residual_mechanism_computes_what_it_did_before_the_split(name):
    assert fingerprint(build(CONFIGS[name])) == pytest.approx(PINNED[name], rel=1e-6)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("pre", Residual), ("deepnorm", Residual), ("pre_gpas", GPASResidual), ("mix_ln_gpas", GPASResidual),
     ("pre_hc_static", HyperResidual), ("sandwich_hc_mhc", HyperResidual)],
)  # fmt: skip
def test_the_layers_build_one_residual_module_by_mechanism(name, kind):
    model = build(CONFIGS[name])
    residuals = [getattr(layer, r) for layer in (*model.encoder, *model.decoder) for r in ("self_attn", "ffn")]
    assert {type(r) for r in residuals} == {kind}


@pytest.mark.parametrize(
    ("plan", "found"),
    [(ResidualPlan((True, False, True)), "slots=(True, False, True)"),
     (ResidualPlan((True, False, False), alpha=2.0), "alpha=2.0"),
     (ResidualPlan((True, False, False), normed_skip=True), "normed_skip=True")],
)  # fmt: skip
def test_a_hyper_connection_refuses_a_plan_that_acts_on_the_sum_it_replaces(plan, found):
    with pytest.raises(ValueError, match="a hyper-connection replaces the sum x \\+ update") as err:
        HyperResidual(nn.Linear(16, 16), plan, lambda: build_norm("layernorm", 16), 0.0, 16, hc=nn.Identity())
    assert found in str(err.value)


def test_a_hyper_connection_refuses_a_block_skip():
    model = build(CONFIGS["pre_hc_static"])
    streams = torch.randn(2, 3, 4 * 16)
    with pytest.raises(ValueError, match="a hyper-connection takes no block skip"):
        model.encoder[0].ffn(streams, skip=streams)
