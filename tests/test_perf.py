"""The FLOP formula behind perf/mfu against PyTorch's own counter (hyper-connections included), and compiled
layers."""

import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import train as train_module
from model.config import ModelConfig
from model.kinds import HC_KINDS
from model.transformer import EncoderDecoder
from tests.helpers.config import make_cfg, model_config
from training.flops import flop_counter, hyper_connection_flops, peak_flops, train_flops


@pytest.mark.parametrize(
    ("sizes", "B", "S", "T"),
    [({}, 8, 12, 9), ({"d_model": 64, "n_heads": 2, "d_ff": 96, "n_enc_layers": 1, "n_dec_layers": 3}, 4, 7, 15)],
)
def test_train_flops_matches_torch_flop_counter(sizes, B, S, T):
    cfg = ModelConfig(src_vocab=50, tgt_vocab=70, dropout=0.0, **sizes)
    model = EncoderDecoder(cfg)
    src, tgt = torch.randint(4, 50, (B, S)), torch.randint(4, 70, (B, T))
    # The math SDPA backend runs attention as matmuls, which the counter sees (the fused CPU kernel it does not).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(src, tgt).float().logsumexp(-1).sum().backward()
    assert train_flops(cfg, B, S, T) == pytest.approx(counter.get_total_flops(), rel=1e-3)


@pytest.mark.parametrize("kind", HC_KINDS)
def test_train_flops_counts_each_hyper_connection_kind_as_the_counter_does(kind):
    cfg = model_config(make_cfg(f"norm.hc={kind}"), 50, 70)  # tiny: D 32, 2 + 2 layers, n = 4 streams
    B, S, T, n, D = 8, 12, 9, cfg.residual_streams, cfg.d_model
    model = EncoderDecoder(cfg)
    src, tgt = torch.randint(4, 50, (B, S)), torch.randint(4, 70, (B, T))
    with sdpa_kernel(SDPBackend.MATH), flop_counter() as counter:
        model(src, tgt).float().logsumexp(-1).sum().backward()
    # Exact, not approximate: every matmul is counted at its shapes on both sides. The one term the counter cannot
    # see is dynamic HC's input gradient of LN(H) W_b, an outer product (an elementwise product to the counter),
    # 2 n D per token of each sublayer under the formula's 2 x forward rule.
    unseen = 2 * n * D * B * (2 * cfg.n_enc_layers * S + 3 * cfg.n_dec_layers * T) if kind == "dynamic" else 0
    assert train_flops(cfg, B, S, T) == counter.get_total_flops() + unseen
    share = 3 * hyper_connection_flops(cfg, B, S, T) / train_flops(cfg, B, S, T)
    # What perf/mfu once left out: the hyper-connections' share of a step (docs/scale.md)
    assert share == pytest.approx({"static": 0.12, "dynamic": 0.23, "mhc": 0.43}[kind], abs=0.005)


def test_peak_flops_only_when_known():
    assert peak_flops(torch.device("cpu"), None) is None
    assert peak_flops(torch.device("cpu"), 2.0) == 2e12


def test_a_run_logs_throughput_memory_and_mfu(tmp_path):
    train_module.train(make_cfg("trainer.max_steps=5", "trainer.peak_tflops=1"), tmp_path)
    row = next(json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "perf/mfu" in line)
    assert 0 < row["perf/mfu"] < 1 and row["mem/peak_gib"] > 0.1 and row["perf/tokens_per_s"] > 0 and row["perf/step_ms"] > 0


@pytest.mark.slow
def test_compiled_layers_train_like_eager_and_keep_telemetry(tmp_path):
    eager = train_module.train(make_cfg("trainer.max_steps=6", "trainer.log_every=1", "telemetry.every=3"), tmp_path / "e")
    compiled = train_module.train(
        make_cfg("trainer.max_steps=6", "trainer.log_every=1", "telemetry.every=3", "trainer.compile=true"), tmp_path / "c"
    )
    rows = {d: [json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("e", "c")}
    for a, b in zip(rows["e"], rows["c"], strict=True):
        for key in a.keys() & {"train/loss", "act/enc.1.out/rms", "act/dec.0.ffn/rms"}:
            assert a[key] == pytest.approx(b[key], rel=1e-4), key
    assert sum("act/enc.1.out/rms" in r for r in rows["c"]) == 3  # steps 1, 3, 6
    assert eager.keys() == compiled.keys()
