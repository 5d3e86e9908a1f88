"""training/step_profile.py: every op's self time in one category, backward ops in their forward op's."""

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from model.norms import LayerNorm
from training.step_profile import BACKWARD, CATEGORIES, event_categories, label_modules, op_category


def test_op_category_puts_matmuls_apart_unless_inside_attention_or_the_optimizer():
    assert op_category("aten::mm", None) == "matmul"
    assert op_category("aten::bmm", "attention") == "attention"  # the math path's matmuls
    assert op_category("aten::mul", "norms") == "norms"
    assert op_category("aten::bernoulli_", None) == "dropout"
    assert op_category("aten::linalg_vector_norm", "optimizer") == "optimizer"  # clip_grad_norm_
    assert op_category("aten::mul", None) == "other ops"


def test_a_custom_norms_backward_ops_count_as_norm_time():
    model = nn.ModuleDict({"norm_in": LayerNorm(16, 1e-5)})  # a norm slot's name, as in model.residual
    x = torch.randn(32, 16, requires_grad=True)
    with label_modules(model), profile(activities=[ProfilerActivity.CPU]) as prof:
        model["norm_in"](x).backward(torch.ones(32, 16))
    events = list(event_categories(prof.events()))
    backward = [(e.name, c) for e, c in events if e.name.startswith(BACKWARD) and "AccumulateGrad" not in e.name]
    assert len(backward) >= 5 and {c for _, c in backward} == {"norms"}, backward
    assert {c for e, c in events if e.name == "aten::mean"} == {"norms"}


def test_bench_profile_prints_a_row_per_size_with_time_in_each_category_summing_to_100(monkeypatch, capsys):
    import re
    import sys

    from scripts import bench

    threads = torch.get_num_threads()
    monkeypatch.setattr(sys, "argv", "bench profile --sizes tiny --warmup 1 --steps 1 --dropout 0.1".split())
    try:
        bench.main()
    finally:
        torch.set_num_threads(threads)  # the bench sets 1 (--threads)
    out = capsys.readouterr().out
    ((ms, cells),) = re.findall(r"^  tiny +0\.10 +0\.10 +(\d+) +(.*)$", out, re.M)
    shares = [float(c.rstrip("%")) for c in cells.split()]
    assert int(ms) > 0 and len(shares) == len(CATEGORIES) and abs(sum(shares) - 100) < 0.1 * len(CATEGORIES)
    assert all(share > 0 for category, share in zip(CATEGORIES, shares, strict=True) if category != "host"), out
