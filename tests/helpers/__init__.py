"""Builders shared by several test files (no test file imports another): configs, runs written by hand, telemetry
models, resume and distributed helpers, the local SLURM cluster."""
