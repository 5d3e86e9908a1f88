"""What a run observes of its model, optimizer and data: the telemetry floor (DESIGN.md sec. 2)."""
