"""`moejax.interrupts.ctrl_c_deferred`: Ctrl-C inside the block reaches the handler before it
when the block ends; a second one at once; off the main thread nothing is held back."""

from __future__ import annotations

import signal
import threading

import pytest

from moejax.interrupts import ctrl_c_deferred


@pytest.fixture(autouse=True)
def python_handles_sigint():
    """Python's own handler, whatever this process inherited (a background run ignores
    SIGINT)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_inside_is_raised_when_the_block_ends():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("the block ran to its end")
    assert done == ["the block ran to its end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_is_raised_at_once():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("after the first")
            signal.raise_signal(signal.SIGINT)
            done.append("after the second")
    assert done == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_no_ctrl_c_no_interrupt_and_the_handler_is_back():
    with ctrl_c_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_off_the_main_thread_nothing_is_held_back():
    seen = []

    def body():
        with ctrl_c_deferred():
            seen.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]
