"""``optim.qk_clip``'s keys, free of torch so that ``training.schema`` checks them before anything loads; the clip
itself: ``training.qk_clip``."""

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class QKClipConfig:
    """QK-Clip's threshold and balance (Kimi Team 2025, "Kimi K2", arXiv 2507.20534, sec. 2.1: tau 100, alpha 0.5).

    Attributes:
        tau: the largest pre-softmax logit a head may keep; a head whose max logit S > tau has its W_q rows scaled
            by (tau / S)^alpha and its W_k rows by (tau / S)^(1 - alpha).
        alpha: the share of the factor that goes to the queries, in [0, 1].

    Raises:
        ValueError: tau not a finite number > 0, alpha outside [0, 1] (the message names the value).
    """

    tau: float
    alpha: float = 0.5

    def __post_init__(self) -> None:
        for key, ok, valid in (
            ("tau", _number(self.tau) and self.tau > 0 and math.isfinite(self.tau), "a finite number > 0 (K2: 100)"),
            ("alpha", _number(self.alpha) and 0 <= self.alpha <= 1, "a number in [0, 1] (K2: 0.5)"),
        ):
            if not ok:
                raise ValueError(f"optim.qk_clip.{key}={getattr(self, key)!r} is invalid; it must be {valid}")

    @classmethod
    def from_value(cls, value: "QKClipConfig | dict | None") -> "QKClipConfig | None":
        """``optim.qk_clip`` as YAML gives it: null (off), or a mapping with ``tau`` and optionally ``alpha``.

        Raises:
            ValueError: a key other than tau and alpha, a missing tau, or a value out of range.
        """
        if value is None or isinstance(value, QKClipConfig):
            return value
        valid = [f.name for f in fields(cls)]
        if unknown := [k for k in value if k not in valid]:
            raise ValueError(f"optim.qk_clip.{unknown[0]} is not a key of optim.qk_clip; valid keys: {', '.join(valid)}")
        if "tau" not in value:
            raise ValueError("optim.qk_clip.tau is missing: expected a number (K2: 100), or optim.qk_clip=null")
        return cls(**value)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
