"""normlab's Dropout (model/dropout.py): nn.Dropout's contract with a rand_like mask; bench.py dropout, which times it."""

import math

import torch
from torch import nn

from model.dropout import Dropout


def test_dropout_is_the_identity_in_eval_mode_and_at_p_0():
    x = torch.randn(4, 8)
    assert Dropout(0.3).eval()(x) is x
    assert Dropout(0.0).train()(x) is x


def test_dropout_zeroes_or_scales_each_element_as_aten_does_and_its_gradient_is_the_mask():
    torch.manual_seed(0)
    p = 0.25
    x = torch.randn(64, 32, requires_grad=True)
    y = Dropout(p).train()(x)
    kept = y != 0
    scale = torch.ones(()).div_(1 - p)  # ATen's CPU dropout: noise.div_(1 - p), then input * noise
    assert torch.equal(y[kept], x[kept] * scale)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, kept * scale)


def test_dropout_keeps_each_element_with_probability_1_minus_p():
    torch.manual_seed(0)
    n, p = 1_000_000, 0.1
    kept = (Dropout(p).train()(torch.ones(n)) != 0).float().mean().item()
    assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)  # 5 binomial standard deviations


def test_the_cpu_uniform_draw_is_on_the_2_to_the_minus_24_grid_the_docstring_counts_with():
    torch.manual_seed(0)
    u = torch.rand(100_000, dtype=torch.float32).double() * 2**24
    assert torch.equal(u, u.round()) and u.max() < 2**24


def test_dropout_draws_in_float32_for_a_bf16_input_and_returns_bf16():
    x = torch.ones(1000, dtype=torch.bfloat16)
    torch.manual_seed(0)
    y = Dropout(0.5).train()(x)
    torch.manual_seed(0)
    keep = torch.rand(1000) >= 0.5
    assert y.dtype == torch.bfloat16 and torch.equal(y != 0, keep)


def test_bench_dropout_times_the_three_variants_as_ratios_to_nn_dropout(monkeypatch, capsys):
    import re
    import sys

    from benchmarks import steps
    from data.batching import Batch
    from scripts import bench

    full = steps.default_model_and_batch

    def eight_words(**kwargs):  # the bench's code on 8 of the batch's 400 words: seconds, not a minute
        model, b = full(**kwargs)
        return model, Batch(b.src[:8], b.tgt_in[:8], b.tgt_out[:8], b.index[:8], 8 * b.tgt_out.shape[1])

    monkeypatch.setattr(steps, "default_model_and_batch", eight_words)
    threads = torch.get_num_threads()
    monkeypatch.setattr(sys, "argv", "bench dropout --size tiny --rounds 2 --clock cpu".split())
    try:
        bench.main()
    finally:
        torch.set_num_threads(threads)  # the bench sets 1 (--threads)
    rows = dict(re.findall(r"^  (\S.*?) +([\d.]+)  \(q1", capsys.readouterr().out, re.M))
    assert list(rows) == ["nn.Dropout (bernoulli_)", "Dropout (rand_like)", "Dropout, attn_dropout 0"]
    assert float(rows["nn.Dropout (bernoulli_)"]) == 1 and all(float(r) > 0 for r in rows.values())


def test_the_model_builds_nn_dropout_and_the_bench_swaps_every_one_both_ways():
    from benchmarks.norms import default_model_and_batch
    from model.dropout import with_dropout

    model, _ = default_model_and_batch(dropout=0.1, size="tiny")
    assert all(type(m) is nn.Dropout for m in model.modules() if isinstance(m, nn.Dropout))  # the model's own: torch's
    for kind in (Dropout, nn.Dropout):
        with_dropout(model, kind)
        dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
        assert len(dropouts) == 2 + 2 * 3 + 2 * 4 and all(type(m) is kind and m.p == 0.1 for m in dropouts)
