"""normlab's model: an encoder-decoder Transformer whose normalization is pluggable.

Imports without Hydra or wandb; everything is built from :class:`model.config.ModelConfig`.
The names below load on first use (PEP 562), so ``model.config`` imports without torch: a run's
config is checked (``training.schema``) before torch loads.
"""

import importlib
from typing import Any

__all__ = ["EncoderDecoder", "ModelConfig", "NormConfig"]
_HOMES = {"EncoderDecoder": "model.transformer", "ModelConfig": "model.config", "NormConfig": "model.config"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
