"""The ``optim.muon`` keys, checked without torch (``training.schema`` imports them before torch loads); what they
drive: ``training.muon`` and ``training.optim.build_optimizer``."""

import dataclasses
from dataclasses import dataclass
from typing import Any

ADJUST_LR_FNS = ("original", "match_rms_adamw")
NS_DTYPES = ("auto", "bfloat16", "float32")


def _require(ok: bool, key: str, value: object, valid: str) -> None:
    if not ok:
        raise ValueError(f"optim.muon.{key}={value!r} is invalid; {valid}")


@dataclass(frozen=True)
class MuonConfig:
    """The ``optim.muon`` keys (``conf/optim/muon.yaml``); their defaults are ``torch.optim.Muon``'s, but for
    ``adjust_lr_fn``.

    Attributes:
        momentum: mu of the momentum buffer B <- mu B + (1 - mu) g (torch's and Keller's ``lerp`` form).
        nesterov: update from g + mu (B - g) (``grad.lerp(buf, mu)``) instead of B.
        ns_steps, ns_coefficients: the Newton-Schulz iterations and their quintic's (a, b, c), Keller Jordan's
            (3.4445, -4.775, 2.0315).
        adjust_lr_fn: how a matrix (A, B)'s lr is scaled: ``original`` by sqrt(max(1, A / B)) (Keller's), whose
            orthogonalized update has RMS about 1 / sqrt(max(A, B)), so it takes a much larger lr than AdamW;
            ``match_rms_adamw`` by 0.2 sqrt(max(A, B)) (Moonlight's ``adjust_lr_for_muon``), an update of RMS about
            0.2, AdamW's typical one, so ``optim.lr`` and ``optim.weight_decay`` serve both optimizers.
        lr_scale: the Muon matrices' peak lr is ``optim.lr * lr_scale`` (the AdamW part's is ``optim.lr``), for
            ``original`` (Keller: 0.02 against AdamW's 3e-4 and up).
        ns_dtype: the Newton-Schulz iteration's dtype: ``bfloat16`` (torch's and Keller's), ``float32``, or ``auto``:
            float32 on a CPU, whose bfloat16 matrix products are emulated where it lacks AVX512-BF16 or AMX
            (``python -m scripts.bench optim`` times both), bfloat16 elsewhere (``training.muon``).

    Raises:
        ValueError: a value out of range, or an unknown key (:meth:`from_keys`).
    """

    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315)
    adjust_lr_fn: str = "match_rms_adamw"
    lr_scale: float = 1.0
    ns_dtype: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ns_coefficients", tuple(self.ns_coefficients))  # a list from YAML
        _require(0 <= self.momentum < 1, "momentum", self.momentum, "it must be a number in [0, 1)")
        _require(1 <= self.ns_steps < 100, "ns_steps", self.ns_steps, "it must be an integer in [1, 100) (torch's limit)")
        _require(len(self.ns_coefficients) == 3, "ns_coefficients", list(self.ns_coefficients), "it must be 3 numbers")
        _require(self.adjust_lr_fn in ADJUST_LR_FNS, "adjust_lr_fn", self.adjust_lr_fn, f"valid: {', '.join(ADJUST_LR_FNS)}")
        _require(0 < self.lr_scale < float("inf"), "lr_scale", self.lr_scale, "it must be a finite number > 0")
        _require(self.ns_dtype in NS_DTYPES, "ns_dtype", self.ns_dtype, f"valid: {', '.join(NS_DTYPES)}")

    @classmethod
    def from_keys(cls, keys: dict[str, Any]) -> "MuonConfig":
        """The config of the ``optim.muon`` mapping ``keys``, checked.

        Raises:
            ValueError: an unknown key (the message lists the valid ones), or a value out of range.
        """
        valid = [f.name for f in dataclasses.fields(cls)]
        if unknown := [k for k in keys if k not in valid]:
            raise ValueError(f"optim.muon.{unknown[0]} is not a key of optim.muon; valid keys: {', '.join(valid)}")
        return cls(**keys)
