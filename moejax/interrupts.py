"""Ctrl-C held back across a region that a KeyboardInterrupt cannot leave cleanly.

Orbax runs its reads and writes on an asyncio event loop fed by TensorStore futures. A
KeyboardInterrupt raised inside it closes the loop while TensorStore's threads still complete
reads into it: each then prints a "RuntimeError: Event loop is closed" traceback to stderr
while the interrupt unwinds (`tests/test_bad_input_main.py` saw them under load), where the
user must see one line. So Ctrl-C there is delivered when the region ends; a second Ctrl-C
inside it is delivered at once (a user who insists gets the interrupt, and the noise).
"""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def ctrl_c_deferred():
    """Runs the block with SIGINT held back: one arriving inside it is re-raised, to whatever
    handled SIGINT before, when the block ends; a second one inside it at once. Left as is
    off the main thread, or where SIGINT is ignored or not handled from Python."""
    previous = signal.getsignal(signal.SIGINT)
    if (threading.current_thread() is not threading.main_thread()
            or previous in (signal.SIG_IGN, signal.SIG_DFL, None)):
        yield
        return
    caught = []

    def hold(signum, frame):
        if caught:  # the second one: now
            signal.signal(signal.SIGINT, previous)
            previous(signum, frame)
        caught.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)
