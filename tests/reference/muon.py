"""Run Keller Jordan's official Muon on fixed matrices and gradients; write what tests/test_muon.py compares with.

    python -m tests.reference.muon [--mirror GIT_DIR] [--out tests/expected/muon_official.pt]

The official code is ``muon.py`` of KellerJordan/Muon (https://github.com/KellerJordan/Muon, MIT licence, Copyright
(c) 2024 Keller Jordan), read from a bare git snapshot (``--mirror``, default the ``fetch`` tool's
``/work/.mirror/KellerJordan+Muon/repo``), written to a temporary directory and imported as it is (it imports torch
and torch.distributed only; ``SingleDeviceMuon`` needs no process group). Nothing of it is copied here or into
normlab: normlab trains with ``torch.optim.Muon``, and the test compares that with these numbers. Needs no network
once the snapshot exists.

Written, per case (a wide (8, 12) and a tall (12, 8) float32 matrix, from a fixed generator): the matrix G, the
official ``zeropower_via_newtonschulz5`` of G and of 3 G (the same in exact arithmetic: their difference is the
iteration's own bfloat16 rounding), and per ``nesterov`` the update and momentum buffer of ``muon_update`` on two
gradients in a row; and the weights after two steps of the official ``SingleDeviceMuon(lr=0.02, weight_decay=0.1,
momentum=0.95)`` (Nesterov, its only form) on those gradients.
"""

import argparse
import importlib.util
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

import torch

MIRROR = Path("/work/.mirror/KellerJordan+Muon/repo")
OFFICIAL_PATH = "muon.py"
OUT = Path(__file__).resolve().parents[2] / "tests" / "expected" / "muon_official.pt"
SHAPES = {"wide": (8, 12), "tall": (12, 8)}
LR, WEIGHT_DECAY, MOMENTUM = 0.02, 0.1, 0.95


def case(shape: tuple[int, int], seed: int) -> dict[str, torch.Tensor]:
    """A weight and two gradients of ``shape`` (float32, from ``torch.Generator`` seeded ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=gen) for name in ("weight", "grad1", "grad2")}


def load_official(mirror: Path, workdir: Path) -> tuple[ModuleType, str]:
    """The official ``muon.py``, from ``mirror`` (a bare git dir) at HEAD; returns (module, commit)."""
    git = ["git", f"--git-dir={mirror}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    source = subprocess.run([*git, "show", f"HEAD:{OFFICIAL_PATH}"], capture_output=True, text=True, check=True).stdout
    path = workdir / "official_muon.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("official_muon", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, commit


def official_results(official: ModuleType, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The official NS output of ``grad1``, ``muon_update``'s two updates per nesterov, two optimizer steps."""
    ns = official.zeropower_via_newtonschulz5
    # NS is invariant to G's scale in exact arithmetic: ns_times3 differs from ns by bfloat16 rounding alone.
    out = {"ns": ns(inputs["grad1"], steps=5).float(), "ns_times3": ns(3 * inputs["grad1"], steps=5).float()}
    for nesterov in (True, False):
        momentum = torch.zeros_like(inputs["weight"])
        for i in (1, 2):
            update = official.muon_update(inputs[f"grad{i}"].clone(), momentum, beta=MOMENTUM, nesterov=nesterov)
            out[f"update{i}_nesterov={nesterov}"] = update.float()
            out[f"momentum{i}_nesterov={nesterov}"] = momentum.clone()
    weight = torch.nn.Parameter(inputs["weight"].clone())
    opt = official.SingleDeviceMuon([weight], lr=LR, weight_decay=WEIGHT_DECAY, momentum=MOMENTUM)
    for i in (1, 2):
        weight.grad = inputs[f"grad{i}"].clone()
        opt.step()
        out[f"weight{i}"] = weight.detach().clone()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR, help=f"bare git dir of KellerJordan/Muon (default {MIRROR})")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        official, commit = load_official(args.mirror, Path(tmp))
        cases = {}
        for seed, (name, shape) in enumerate(SHAPES.items()):
            inputs = case(shape, seed)
            cases[name] = {"inputs": inputs, "official": official_results(official, inputs)}
    torch.save({"source": f"KellerJordan/Muon {commit} {OFFICIAL_PATH}", "cases": cases}, args.out)
    print(f"wrote {args.out} from KellerJordan/Muon {commit}")


if __name__ == "__main__":
    main()
