"""normlab's model: an encoder-decoder Transformer whose normalization is pluggable.

Imports without Hydra or wandb; everything is built from :class:`model.config.ModelConfig`
(``model.transformer.EncoderDecoder``). This file imports nothing, so ``model.config`` and
``model.kinds`` load without torch: a run's config is checked (``training.schema``) before torch loads.
"""
