"""What the training loop in train.py calls: optimizer and schedule, evaluation, checkpoints, logging."""
