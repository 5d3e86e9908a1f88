"""training.interrupt.StartUpSigint: a Ctrl-C during a run's set-up stays a Ctrl-C, whatever error CPython turns it
into, and only there."""

import signal
from collections.abc import Iterator

import pytest

from training.interrupt import StartUpSigint


class Refused(ValueError):
    """An error raised on purpose (as a refused resume is): it leaves the block as it is."""


@pytest.fixture(autouse=True)
def python_s_own_sigint_handler() -> Iterator[None]:
    # as in a run started from a terminal; a test worker may have SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _swallowed_ctrl_c() -> None:
    """A SIGINT whose KeyboardInterrupt the code caught and went on from (as CPython's import machinery did)."""
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        pass


def test_a_ctrl_c_in_the_block_raises_where_the_code_is_and_the_handler_is_restored() -> None:
    with pytest.raises(KeyboardInterrupt), StartUpSigint():
        signal.raise_signal(signal.SIGINT)
        pytest.fail("the Ctrl-C did not stop the block")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_error_after_a_ctrl_c_leaves_as_the_ctrl_c_caused_by_it() -> None:
    with pytest.raises(KeyboardInterrupt) as raised, StartUpSigint():
        _swallowed_ctrl_c()
        raise TypeError("expected a message argument")
    assert isinstance(raised.value.__cause__, TypeError)


def test_without_a_ctrl_c_or_of_a_kept_type_an_error_stays_itself() -> None:
    with pytest.raises(TypeError), StartUpSigint():
        raise TypeError("a bug")
    with pytest.raises(Refused), StartUpSigint(keep=(Refused,)):
        _swallowed_ctrl_c()
        raise Refused("another run's dir")


def test_an_ignored_sigint_stays_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with StartUpSigint():
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
