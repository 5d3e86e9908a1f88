"""The progress bar shows every step's learning rate, and the loss with the step that measured it."""

import io

from training.progress import Progress


def test_the_bar_shows_each_steps_lr_and_the_loss_of_its_logging_step():
    progress = Progress(total=10, initial=0, disable=False)
    progress.bar.fp = io.StringIO()  # not the terminal
    progress.step(1e-4)
    assert progress.bar.postfix == "lr=1.00e-04"  # nothing measured yet: no loss shown
    progress.logged(1, {"train/loss": 4.5381, "perf/tokens_per_s": 314.2})
    for lr in (2e-4, 3e-4):
        progress.step(lr)
    # Step 3: its own lr, and step 1's loss labelled as step 1's (it was shown as current before).
    assert progress.bar.postfix == "lr=3.00e-04, loss=4.538 (step 1), tok_s=314" and progress.bar.n == 3
