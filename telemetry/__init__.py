"""What a run observes of its model and optimizer: the telemetry floor (docs/architecture.md), above model/.

One module per thing observed, each writing 0-dim device tensors into one shared record:
``activations`` (``act/``), ``attention`` (``attn/``), ``batch_stats`` (``bstat/``), ``hyper_connections``
(``hc/``), ``logits`` (``out/``),
``parameters`` (``grad/``, ``weight/``, ``scale/``) and ``optimizer`` (``update/``, ``optim/below_eps``);
``recorder.Telemetry`` composes them and is what the training step calls; ``config.TelemetryConfig``
(torch-free, so the config checks load no torch) says what to record; ``core`` holds what the parts share.
"""
