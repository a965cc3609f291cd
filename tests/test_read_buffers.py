"""Reusable read buffers (`moejax.checkpoint.read_buffers`): a buffer is handed out again only
once nothing — a view, the host tier's entry, a JAX array aliasing it — still refers to it, so
reuse never changes bytes anything still reads; and reads through the reader reuse them."""

from __future__ import annotations

import gc

import jax
import numpy as np
from fuzzing import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.checkpoint import to_host
from moejax.checkpoint.read_buffers import PAGE, ReadBuffers


def test_a_buffer_is_page_aligned_writable_and_reused_only_after_its_last_view_dies():
    pool = ReadBuffers(3 * PAGE)
    a = pool.take()
    assert a.ctypes.data % PAGE == 0 and a.nbytes == 3 * PAGE and a.flags.writeable
    part = a[PAGE:].view(np.uint16)  # what `Record.weights` hands on: views of the buffer
    del a
    gc.collect()
    b = pool.take()  # the first is still viewed by `part`: a second buffer
    assert pool.allocated == 2 and b.ctypes.data != part.ctypes.data - PAGE
    del part, b
    gc.collect()
    assert pool.free == 2
    c = pool.take()
    assert pool.allocated == 2 and pool.reused == 1 and c.nbytes == 3 * PAGE


def test_a_jax_array_aliasing_a_buffer_keeps_it_from_reuse():
    """On the CPU backend `device_put` to pinned host memory may alias a page-aligned numpy
    array; the pool must not hand that memory out while the JAX array lives."""
    pool = ReadBuffers(PAGE)
    buffer = pool.take()
    buffer[:] = 7
    host = to_host(buffer.view(np.float32))
    del buffer
    gc.collect()
    other = pool.take()
    other[:] = 0  # a new read landing; must not touch what `host` holds
    np.testing.assert_array_equal(np.asarray(host).view(np.uint8), 7)
    assert pool.allocated == 2
    del host, other
    gc.collect()
    assert pool.free == 2


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), min_size=1, max_size=40))
def test_reuse_never_changes_what_a_holder_still_reads(steps):
    """Any interleaving of reads (take, fill with a fresh value) and releases (drop a holder:
    a plain view or a JAX array made from one): every holder still alive reads its value."""
    pool = ReadBuffers(PAGE)
    holders: list[tuple[int, object]] = []
    value = 0
    for take, pick in steps:
        if take or not holders:
            value = (value + 1) % 256
            buffer = pool.take()
            buffer[:] = value
            held = to_host(buffer) if pick % 2 else buffer[16:]
            holders.append((value, held))
            del buffer
        else:
            holders.pop(pick % len(holders))
        gc.collect(0)  # young cycles (a JAX array's) go now, so reuse happens while others live
        for want, held in holders:
            assert (np.asarray(held) == want).all()
    assert pool.allocated <= len(steps)
    jax.effects_barrier()
