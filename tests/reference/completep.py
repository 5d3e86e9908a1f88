"""Run EleutherAI/nanoGPT-mup's own CompleteP code (branch ``completep``, the code Dey et al. 2025 ship); write what
tests/test_parametrization.py compares normlab's ``completep`` with.

    git clone -b completep https://github.com/EleutherAI/nanoGPT-mup     # its model.py imports torch only
    python -m tests.reference.completep nanoGPT-mup/model.py [--out tests/expected/completep_official.json]

Nothing of it is copied into normlab: the script imports the file it is given. Per case (a width multiplier m and a
depth multiplier m_L, alpha = 1, CompleteP), its ``GPT`` with ``mup_enabled``, ``depth_alpha_enabled`` and the two
multipliers builds its optimizer at lr 1, weight decay 1 and eps 1 (``GPT.configure_optimizers``), so each group's
``lr_scale``, weight decay and eps are the factors CompleteP puts on them; and its first ``Block`` gives the branch
multiplier (``residual_scaling``). The groups are written by role: the embeddings (and the tied readout), the hidden
norms, the hidden matrices, their biases and the final norm.
"""

import argparse
import importlib.util
import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "tests" / "expected" / "completep_official.json"
# (width multiplier, depth multiplier): wider and deeper, deeper only, narrower and deeper
CASES = {"m2_l2": (2.0, 2.0), "m1_l3": (1.0, 3.0), "m0.5_l4": (0.5, 4.0)}
ROLES = ("embeddings", "hidden_norms", "hidden_matrices", "hidden_biases", "final_norm")  # configure_optimizers' order


def official(model_py: Path, m: float, m_depth: float) -> dict[str, object]:
    """The branch multiplier and, per role, ``{"lr_scale", "weight_decay", "eps"}`` as the official code gives them."""
    spec = importlib.util.spec_from_file_location("nanogpt_completep", model_py)
    assert spec is not None and spec.loader is not None
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    config = code.GPTConfig(
        block_size=8,
        vocab_size=16,
        n_layer=2,
        n_head=2,
        n_embd=16,
        mup_enabled=True,
        mup_width_multiplier=m,
        depth_alpha_enabled=True,
        depth_multiplier=m_depth,
        depth_alpha_exp=1.0,
    )
    model = code.GPT(config)
    opt = model.configure_optimizers(weight_decay=1.0, learning_rate=1.0, betas=(0.9, 0.95), adam_eps=1.0, device_type="cpu")
    groups = {
        role: {"lr_scale": g["lr_scale"], "weight_decay": g["weight_decay"], "eps": g["eps"]}
        for role, g in zip(ROLES, opt.param_groups, strict=True)
    }
    return {"branch_scale": model.transformer.h[0].residual_scaling, "groups": groups}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_py", type=Path, help="nanoGPT-mup's model.py, branch completep")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    written = {
        name: {"width_mult": m, "depth_mult": m_depth, **official(args.model_py, m, m_depth)}
        for name, (m, m_depth) in CASES.items()
    }
    args.out.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
