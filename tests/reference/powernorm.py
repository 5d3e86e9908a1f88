"""Run the official PowerNorm and normlab's side by side; write the official results for tests/test_powernorm.py.

    python -m tests.reference.powernorm [--mirror GIT_DIR] [--out tests/expected/powernorm_official.pt]

The official module is ``fairseq/modules/norms/mask_powernorm.py`` of sIncerass/powernorm (ICML 2020), read
from a bare git snapshot of that repository (``--mirror``, default the ``fetch`` tool's
``/work/.mirror/sIncerass+powernorm/repo``), written to a temporary directory and imported from there as it
is: it imports torch only, so nothing is stubbed (its backward's ``ctx.saved_variables`` still works on torch
2.x, with a DeprecationWarning). Needs no network once the snapshot exists.

Each case builds ``MaskPowerNorm`` and ``model.powernorm.PowerNorm`` with the same constants and the same
off-init weight and bias, then runs several training iterations (before, at and after ``warmup_iters``) on the
same inputs, padding masks and upstream gradients, and one eval call. The official module takes x as (T, B, C)
with a (B, T) mask True at pads; normlab's takes (B, L, D) with ``keep`` True at real tokens. Written per case:
the inputs, the constants, and per iteration the official output, input gradient, weight and bias gradients and
buffers (``running_phi``, ``ema_gz``, ``iters``); printed: normlab's largest absolute difference to each.
"""

import argparse
import importlib.util
import inspect
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from model.powernorm import PowerNorm

MIRROR = Path("/work/.mirror/sIncerass+powernorm/repo")
OFFICIAL_PATH = "fairseq/modules/norms/mask_powernorm.py"
OUT = Path(__file__).resolve().parents[2] / "tests" / "expected" / "powernorm_official.pt"

# name -> (dtype, constructor overrides, B, L, D, real lengths per row for each training iteration).
# Lengths L mean no padding: that iteration passes pad_mask=None to the official module, keep all True here.
CASES = {
    "float64_groups2_warmup3": (torch.float64, {"warmup_iters": 3, "group_num": 2}, 3, 5, 8,
                                [(5, 2, 4), (3, 5, 1), (5, 5, 5), (4, 4, 2), (2, 5, 3), (5, 1, 4)]),
    "float32_defaults_warmup2": (torch.float32, {"warmup_iters": 2}, 4, 3, 6,
                                 [(3, 1, 2, 3), (3, 3, 3, 3), (2, 3, 1, 3), (1, 2, 3, 3)]),
}  # fmt: skip


def load_official(mirror: Path, workdir: Path):
    """The official module, from ``mirror`` (a bare git dir) at HEAD; returns (module, commit)."""
    commit = subprocess.run(["git", f"--git-dir={mirror}", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    source = subprocess.run(
        ["git", f"--git-dir={mirror}", "show", f"HEAD:{OFFICIAL_PATH}"], capture_output=True, text=True, check=True
    )
    path = workdir / "mask_powernorm.py"
    path.write_text(source.stdout)
    spec = importlib.util.spec_from_file_location("official_mask_powernorm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, commit.stdout.strip()


def official_defaults(module) -> dict[str, object]:
    """The keyword defaults of ``MaskPowerNorm.__init__`` and ``GroupScaling1D.__init__`` (its eps as ``group_eps``)."""
    defaults = {k: p.default for k, p in inspect.signature(module.MaskPowerNorm.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}  # fmt: skip
    defaults["group_eps"] = inspect.signature(module.GroupScaling1D.__init__).parameters["eps"].default
    return defaults


def make_inputs(dtype, B, L, D, lengths, seed):
    """Per iteration x (B, L, D), keep (B, L) and the upstream gradient (B, L, D), nonzero at pads too; plus the
    eval input; and the off-init weight and bias (D,)."""
    g = torch.Generator().manual_seed(seed)
    iters = []
    for row_lengths in lengths:
        x = (torch.randn(B, L, D, generator=g) * torch.linspace(0.5, 3.0, D)).to(dtype)
        keep = torch.arange(L)[None, :] < torch.tensor(row_lengths)[:, None]
        iters.append({"x": x, "keep": keep, "grad_out": torch.randn(B, L, D, generator=g).to(dtype)})
    eval_x = torch.randn(B, L, D, generator=g).to(dtype) * 2
    weight = (1 + 0.3 * torch.randn(D, generator=g)).to(dtype)
    bias = (0.2 * torch.randn(D, generator=g)).to(dtype)
    return iters, eval_x, weight, bias


def official_call(norm, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The official ``MaskPowerNorm`` on normlab's (B, L, D) x: it takes (T, B, C) and a padding mask (True at
    pads, None when there are none)."""
    pad_mask = None if bool(keep.all()) else ~keep
    return norm(x.transpose(0, 1), pad_mask=pad_mask).transpose(0, 1)


def run(norm, call, iters, eval_x, weight, bias):
    """``norm`` with ``weight`` and ``bias``, trained on ``iters`` then run in eval on ``eval_x``, through
    ``call(norm, x, keep)`` ((B, L, D) in and out): its results per iteration, and its eval output."""
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.bias.copy_(bias)
    norm.train()
    steps = []
    for it in iters:
        x = it["x"].clone().requires_grad_(True)
        norm.weight.grad = norm.bias.grad = None
        y = call(norm, x, it["keep"])
        y.backward(it["grad_out"])
        steps.append({
            "y": y.detach().clone(), "grad_x": x.grad.clone(), "grad_weight": norm.weight.grad.clone(),
            "grad_bias": norm.bias.grad.clone(), "running_phi": norm.running_phi.reshape(-1).clone(),
            "ema_gz": norm.ema_gz.reshape(-1).clone(), "iters": int(norm.iters.item()),
        })  # fmt: skip
    norm.eval()
    with torch.no_grad():
        eval_y = call(norm, eval_x, torch.ones(eval_x.shape[:2], dtype=torch.bool)).clone()
    return steps, eval_y


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="bare git dir of sIncerass/powernorm")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        module, commit = load_official(args.mirror, Path(tmp))
    result = {"source": f"sIncerass/powernorm@{commit}:{OFFICIAL_PATH}", "defaults": official_defaults(module), "cases": {}}
    print(f"official: {result['source']}\ndefaults: {result['defaults']}")
    for i, (name, (dtype, overrides, B, L, D, lengths)) in enumerate(CASES.items()):
        iters, eval_x, weight, bias = make_inputs(dtype, B, L, D, lengths, seed=i)
        official = module.MaskPowerNorm(D, **overrides).to(dtype)
        steps, eval_y = run(official, official_call, iters, eval_x, weight, bias)
        ours, our_eval = run(PowerNorm(D, **overrides).to(dtype), PowerNorm.__call__, iters, eval_x, weight, bias)
        result["cases"][name] = {"dtype": dtype, "overrides": overrides, "inputs": iters, "eval_x": eval_x,
                                 "weight": weight, "bias": bias, "steps": steps, "eval_y": eval_y}  # fmt: skip
        print(f"{name}: max |normlab - official| over {len(steps)} training iterations")
        for key in ("y", "grad_x", "grad_weight", "grad_bias", "running_phi", "ema_gz"):
            diff = max((a[key] - b[key]).abs().max().item() for a, b in zip(ours, steps, strict=True))
            print(f"  {key:12s} {diff:.3e}")
        assert [s["iters"] for s in ours] == [s["iters"] for s in steps]
        print(f"  {'eval y':12s} {(our_eval - eval_y).abs().max().item():.3e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(result, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
