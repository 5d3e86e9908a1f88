"""The benchmarks' library, behind ``python -m scripts.bench``: timing rounds and ratios measured side by side
(:mod:`benchmarks.timing`), normlab's training step against ``torch.nn.Transformer`` (:mod:`benchmarks.model`), and bf16
against fp32 (:mod:`benchmarks.precision`). Speed targets live here, never in timed tests."""
