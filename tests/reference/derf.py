"""Run the official Derf module and normlab's side by side; print the official numbers tests/test_derf.py pins.

    python -m tests.reference.derf [--mirror GIT_DIR]

The official module is ``Dynamic_erf`` of zlab-princeton/Derf, file ``DNA model/dynamic_erf.py`` (the same class,
parameters and forward as its GPT-2 patch ``language model/model_derf.patch``: ``weight * erf(alpha * x + shift) +
bias``; the ViT/DiT copies differ only by a channels-first branch and a timm import), read from a bare git snapshot
(``--mirror``, default the ``fetch`` tool's ``/work/.mirror/zlab-princeton+Derf/repo``), written to a temporary
directory and imported as it is: it imports torch only. Needs no network once the snapshot exists.

Both modules get the same off-init parameters (alpha 0.7, shift -0.3, weight and bias spread over the channels) and
the same float64 input; printed: the official output and input gradient (of ``(y * g).sum()``, ``g`` fixed) as Python
literals, and normlab's largest absolute difference to each.
"""

import argparse
import importlib.util
import subprocess
import tempfile
from pathlib import Path

import torch

from model.norms import Derf

MIRROR = Path("/work/.mirror/zlab-princeton+Derf/repo")
OFFICIAL_PATH = "DNA model/dynamic_erf.py"
D = 8


def case() -> dict[str, torch.Tensor]:
    """The input, upstream gradient and parameters both modules get (float64, no RNG: the same on every machine)."""
    x = torch.linspace(-3.0, 3.0, 2 * D, dtype=torch.float64).reshape(2, D)
    return {
        "x": x,
        "g": torch.linspace(1.0, -0.5, 2 * D, dtype=torch.float64).reshape(2, D),
        "alpha": torch.tensor([0.7], dtype=torch.float64),
        "shift": torch.tensor([-0.3], dtype=torch.float64),
        "weight": torch.linspace(0.5, 2.0, D, dtype=torch.float64),
        "bias": torch.linspace(-0.2, 0.2, D, dtype=torch.float64),
    }


def run(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``module``'s output and input gradient on ``inputs``, its parameters set from them."""
    module = module.double()
    with torch.no_grad():
        for name in ("alpha", "shift", "weight", "bias"):
            getattr(module, name).copy_(inputs[name])
    x = inputs["x"].clone().requires_grad_()
    y = module(x)
    (y * inputs["g"]).sum().backward()
    return y.detach(), x.grad


def load_official(mirror: Path, workdir: Path):
    """The official module, from ``mirror`` (a bare git dir) at HEAD; returns (module, commit)."""
    git = ["git", f"--git-dir={mirror}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    source = subprocess.run([*git, "show", f"HEAD:{OFFICIAL_PATH}"], capture_output=True, text=True, check=True).stdout
    path = workdir / "dynamic_erf.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("official_dynamic_erf", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR, help=f"bare git dir of zlab-princeton/Derf (default {MIRROR})")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        official, commit = load_official(args.mirror, Path(tmp))
    inputs = case()
    ref = official.Dynamic_erf(D)  # its defaults: alpha 0.5, shift 0
    print(f"# zlab-princeton/Derf {commit}, {OFFICIAL_PATH}: Dynamic_erf")
    print("# at init:", {n: p.detach().flatten().tolist()[:2] for n, p in ref.named_parameters()})
    y_ref, gx_ref = run(ref, inputs)
    y, gx = run(Derf(D), inputs)
    print("OFFICIAL_Y =", y_ref.tolist())
    print("OFFICIAL_GRAD_X =", gx_ref.tolist())
    print(f"# normlab Derf: max |y - official| = {(y - y_ref).abs().max().item():.3g}, "
          f"max |grad_x - official| = {(gx - gx_ref).abs().max().item():.3g}")  # fmt: skip


if __name__ == "__main__":
    main()
