"""CUDA only (``-m gpu``; skipped without a device): bf16 autocast (``trainer.precision``) with fp32 master weights,
fused SDPA kernels, fused AdamW, and compiled layers. Run them with scripts/gpu_check.sh."""

import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import train as train_module
from data.batching import Batch
from model.config import ModelConfig, NormConfig
from model.transformer import EncoderDecoder
from telemetry.config import TelemetryConfig
from telemetry.recorder import Telemetry
from tests.helpers.config import make_cfg
from training.optim import build_optimizer, build_scheduler
from training.precision import autocast
from training.presets import default_optim
from training.schema import ScheduleConfig
from training.step import StepOptions, train_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def batch(B: int = 64, S: int = 24, T: int = 20, V: int = 100) -> Batch:
    gen = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, V, (B, S), generator=gen), torch.randint(4, V, (B, T + 1), generator=gen)
    src[: B // 2, S // 2 :] = 0  # padding, so the key-padding mask is exercised
    return Batch(src, tgt[:, :-1], tgt[:, 1:], list(range(B)), B * T).to(torch.device("cuda"))


@pytest.mark.parametrize("impl", ["custom", "native"])
def test_bf16_steps_on_fused_kernels_keep_fp32_master_weights_and_learn(impl):
    cfg = ModelConfig(src_vocab=100, tgt_vocab=100, d_model=256, n_heads=4, d_ff=512, norm=NormConfig(impl=impl))
    model = EncoderDecoder(cfg).cuda()
    opt = build_optimizer(model, default_optim(lr=1e-3))
    sched = build_scheduler(opt, 1e-3, ScheduleConfig(0, "constant"), 100)
    tele, b = Telemetry(model, TelemetryConfig(every=0)), batch()
    losses = []
    # Flash / memory-efficient SDPA only: if our masks forced the math kernel (the attention matrix
    # materialized), this would raise "No available kernel".
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        for _ in range(30):
            options = StepOptions(world=1, label_smoothing=0.0, grad_clip=1.0,
                                  autocast=autocast("bf16", b.src.device), step_tokens=b.n_tgt_tokens)  # fmt: skip
            losses.append(train_step(model, [b], opt, sched, tele, options).loss.item())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert opt.defaults["fused"] is True
    assert losses[-1] < losses[0] - 1.0  # memorizes the batch


def test_a_cuda_run_logs_mfu_and_compiled_layers_match_eager(tmp_path):
    common = ["trainer.device=cuda", "trainer.max_steps=8", "trainer.log_every=1", "telemetry.every=4"]
    train_module.train(make_cfg(*common), tmp_path / "eager")
    train_module.train(make_cfg(*common, "trainer.compile=true"), tmp_path / "compiled")
    rows = {d: [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("eager", "compiled")}
    for a, b in zip(rows["eager"], rows["compiled"], strict=True):
        if "train/loss" in a:
            assert a["train/loss"] == pytest.approx(b["train/loss"], rel=2e-2)  # bf16 kernels differ after fusion
    mfu = [r["perf/mfu"] for r in rows["compiled"] if "perf/mfu" in r]
    assert mfu and all(0 < m < 1 for m in mfu)
    assert any("act/dec.1.out/rms" in r for r in rows["compiled"])
    assert json.loads((tmp_path / "eager" / "status.json").read_text())["precision"] == "bf16"  # trainer.precision=auto
