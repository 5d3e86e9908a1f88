"""normlab's model: an encoder-decoder Transformer whose normalization is pluggable.

Imports without Hydra or wandb; everything is built from :class:`model.config.ModelConfig`.
"""

from model.config import ModelConfig, NormConfig
from model.transformer import EncoderDecoder

__all__ = ["EncoderDecoder", "ModelConfig", "NormConfig"]
