"""Hardware profiles and the host->device transfer model (moejax/timing/hardware.py, clock.py):
overrides (0 is a value, None keeps the preset's), validation naming the field, and copy
engines that share one host link — N concurrent transfers never move more than the link's
bytes per second, while their fixed latencies overlap."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.jobs.specs import hardware_from
from moejax.testing import config_from_flags
from moejax.timing import hardware, timeline
from moejax.timing.clock import VirtualClock, WallClock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1_000_000


# -- overrides and validation -----------------------------------------------------------------
def _flags_config(*flags: str):
    """configs/default.py with `--config.FIELD=VALUE` flags, parsed as moejax.main does."""
    return config_from_flags(os.path.join(ROOT, "configs", "default.py"), *flags)


def test_a_zero_override_is_applied_and_an_absent_one_keeps_the_preset():
    hw = hardware_from(_flags_config("--config.hardware.h2d_latency_s=0"))
    assert hw.h2d_latency_s == 0.0 and type(hw.h2d_latency_s) is float
    assert hw.h2d_gbps == hardware.PRESETS["a100_specmd"].h2d_gbps
    assert hardware_from(_flags_config()) == dataclasses.replace(
        hardware.PRESETS["a100_specmd"], link_gbps=5.0)
    hw = hardware_from(_flags_config("--config.hardware.preset=h200",
                                     "--config.hardware.launch_s=0",
                                     "--config.hardware.copy_engines=1"))
    assert (hw.launch_s, hw.copy_engines, hw.h2d_latency_s) == (0.0, 1, 8e-6)
    # The same through a config object (config files, sweep overrides) and through get().
    c = base_config()
    c.hardware.h2d_latency_s = 0.0
    assert hardware_from(c).h2d_latency_s == 0.0
    assert hardware.get("cpu", launch_s=0, h2d_gbps=None).launch_s == 0
    assert hardware.get("cpu", h2d_gbps=None).h2d_gbps == 10.0


def test_override_types_are_checked_like_any_declared_field():
    from launch.worker import OverrideError, apply_overrides

    c = base_config()
    apply_overrides(c, {"hardware.h2d_latency_s": 0.0, "hardware.copy_engines": 3,
                        "hardware.h2d_gbps": 16})  # an int where a float is declared is fine
    assert (c.hardware.h2d_latency_s, c.hardware.copy_engines, c.hardware.h2d_gbps) == (
        0.0, 3, 16.0)
    with pytest.raises(OverrideError, match="hardware.copy_engines=1.5"):
        apply_overrides(base_config(), {"hardware.copy_engines": 1.5})
    with pytest.raises(OverrideError, match="hardware.h2d_gbps='fast'"):
        apply_overrides(base_config(), {"hardware.h2d_gbps": "fast"})
    with pytest.raises(Exception, match="copy_engines"):
        _flags_config("--config.hardware.copy_engines=1.5")


@pytest.mark.parametrize("flag, message", [
    ("h2d_gbps=0", r"hardware.h2d_gbps=0.0 must be a finite number > 0"),
    ("h2d_gbps=-5", r"hardware.h2d_gbps=-5.0 must be a finite number > 0"),
    ("link_gbps=0", r"hardware.link_gbps=0.0 must be a finite number > 0"),
    ("peak_tflops=0", r"hardware.peak_tflops=0.0 must be a finite number > 0"),
    ("hbm_gbps=-1", r"hardware.hbm_gbps=-1.0 must be a finite number > 0"),
    ("h2d_latency_s=-1e-6", r"hardware.h2d_latency_s=-1e-06 must be a finite number >= 0"),
    ("launch_s=-1", r"hardware.launch_s=-1.0 must be a finite number >= 0"),
    ("copy_engines=0", r"hardware.copy_engines=0 must be an integer >= 1"),
    ("h2d_gbps=nan", r"hardware.h2d_gbps=nan must be a finite number > 0"),
])
def test_invalid_values_are_errors_naming_the_field(flag, message):
    config = _flags_config(f"--config.hardware.{flag}")
    with pytest.raises(ConfigError, match=message):
        hardware_from(config)


def test_get_errors():
    with pytest.raises(ConfigError, match="hardware.preset='tpu'"):
        hardware.get("tpu")
    with pytest.raises(ConfigError, match="no field 'pcie_gbps'"):
        hardware.get("h200", pcie_gbps=1.0)
    with pytest.raises(ConfigError, match="copy_engines=2.0 must be an integer"):
        hardware.get("h200", copy_engines=2.0)


def test_presets_validate_and_resolve_their_link():
    for name, preset in hardware.PRESETS.items():
        preset.validate()
        hw = hardware.get(name)
        assert hw.link_gbps == hw.link_bandwidth_gbps > 0
    # h2d_gbps alone moves the link with it (one engine's worth), on every preset...
    assert hardware.get("h200", h2d_gbps=16.0).link_gbps == 16.0
    assert hardware.get("a100_specmd", h2d_gbps=32.0).link_gbps == 32.0
    # ...and link_gbps sets a link that differs from one engine.
    hw = hardware.get("h200", h2d_gbps=25.0, link_gbps=40.0)
    assert (hw.h2d_gbps, hw.link_gbps) == (25.0, 40.0)


# -- the transfer model -------------------------------------------------------------------------
def _old_fifo_ready(hw, transfers):
    """The model before the shared link (one-engine presets must keep these numbers)."""
    free = [0.0] * hw.copy_engines
    out = []
    for nbytes, issue_at in transfers:
        e = min(range(len(free)), key=free.__getitem__)
        start = max(issue_at, free[e])
        free[e] = start + hw.h2d_latency_s + nbytes / (hw.h2d_gbps * 1e9)
        out.append(free[e])
    return out


def test_h200_two_engines_share_the_link_by_hand():
    """h200: 2 engines, 40 GB/s per engine and on the shared link, 8 us per transfer."""
    clock = VirtualClock(hardware.get("h200"))
    lat = 8e-6
    # Two 40 MB transfers issued together: the link moves 40 MB per ms, so the second lands
    # a full millisecond after the first (the old model landed both at 1.008 ms: 80 GB/s).
    a = clock.schedule(40 * MB, 0.0)
    b = clock.schedule(40 * MB, 0.0)
    assert (a.engine, b.engine) == (0, 1)
    assert a.end == pytest.approx(lat + 1e-3, rel=1e-12)  # 1.008 ms
    assert b.link_start == pytest.approx(a.end, rel=1e-12)  # its bytes wait for a's
    assert b.end == pytest.approx(lat + 2e-3, rel=1e-12)  # 2.008 ms
    # A third, 4 MB (100 us on the link), goes on engine 0 (free first, at 1.008 ms); its
    # latency runs 1.008-1.016 ms while b's bytes hold the link, its bytes follow b's.
    c = clock.schedule(4 * MB, 0.0)
    assert c.engine == 0 and c.start == pytest.approx(1.008e-3, rel=1e-12)
    assert c.end == pytest.approx(2.008e-3 + 0.1e-3, rel=1e-12)  # 2.108 ms

    # Small transfers: the second engine hides the latency. 0.4 MB = 10 us on the link.
    two = VirtualClock(hardware.get("h200"))
    ends = [two.transfer(400_000, 0.0) for _ in range(2)]
    assert ends == pytest.approx([18e-6, 28e-6], rel=1e-9)  # 8+10; 8 overlapped, +10
    one = VirtualClock(hardware.get("h200", copy_engines=1))
    ends = [one.transfer(400_000, 0.0) for _ in range(2)]
    assert ends == pytest.approx([18e-6, 36e-6], rel=1e-9)  # back to back: 8+10+8+10


def test_wall_clock_books_transfers_the_same_way():
    hw = hardware.get("h200")
    v, w = VirtualClock(hw), WallClock(hw)
    for nbytes, t in [(40 * MB, 0.0), (40 * MB, 0.0), (4 * MB, 0.0005)]:
        assert v.transfer(nbytes, t) == w.transfer(nbytes, t)


_transfers = st.lists(st.tuples(st.integers(0, 64 * MB),
                                st.floats(0.0, 0.02, allow_nan=False, allow_infinity=False)),
                      min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(transfers=_transfers)
def test_one_engine_presets_keep_their_numbers(transfers):
    """a100_specmd and cpu (one engine, link = engine): bit for bit the old FIFO model."""
    for name in ("a100_specmd", "cpu"):
        hw = hardware.get(name)
        clock = VirtualClock(hw)
        assert [clock.transfer(n, t) for n, t in transfers] == _old_fifo_ready(hw, transfers)


@settings(max_examples=300, deadline=None)
@given(transfers=_transfers, h2d_gbps=st.floats(0.5, 80.0), link_gbps=st.floats(0.5, 80.0),
       latency=st.sampled_from([0.0, 1e-6, 8e-6, 1e-4]))
def test_one_engine_books_alone_as_in_full(transfers, h2d_gbps, link_gbps, latency):
    """`timeline.book_alone` (the lean replay kernel's booking on one copy engine) gives
    `book_in`'s end and link time bit for bit, transfer after transfer from an empty clock,
    whichever of the engine and the link is the slower."""
    engine, link = [0.0], 0.0
    alone, alone_link = 0.0, 0.0
    engine_bps, link_bps = h2d_gbps * 1e9, link_gbps * 1e9
    for nbytes, issue_at in transfers:
        *_, link, end = timeline.book_in(engine, 0, 1, link, nbytes, issue_at, latency,
                                         engine_bps, link_bps)
        per_link = nbytes / link_bps
        alone, alone_link = timeline.book_alone(alone, issue_at, latency, per_link,
                                                max(nbytes / engine_bps, per_link))
        assert (alone, alone_link) == (end, link) and engine == [end]


@settings(max_examples=300, deadline=None)
@given(transfers=_transfers, engines=st.integers(1, 4),
       h2d_gbps=st.floats(1.0, 80.0), link_gbps=st.floats(1.0, 80.0),
       latency=st.sampled_from([0.0, 1e-6, 8e-6, 1e-4]))
def test_the_link_is_shared_and_engines_stay_fifo(transfers, engines, h2d_gbps, link_gbps,
                                                  latency):
    hw = hardware.get("h200", copy_engines=engines, h2d_gbps=h2d_gbps, link_gbps=link_gbps,
                      h2d_latency_s=latency)
    clock = VirtualClock(hw)
    slots = [clock.schedule(n, t) for n, t in transfers]
    link_bps, engine_bps = link_gbps * 1e9, h2d_gbps * 1e9
    last_end: dict[int, float] = {}
    for (nbytes, issue_at), s in zip(transfers, slots):
        assert 0 <= s.engine < engines
        # Ready times are non-decreasing per engine (each engine is a FIFO).
        assert s.end >= last_end.get(s.engine, 0.0)
        last_end[s.engine] = s.end
        # Neither the engine's latency and rate nor the link's rate is beaten.
        assert s.start >= issue_at
        assert s.end >= s.start + latency + nbytes / min(engine_bps, link_bps) * (1 - 1e-12)
        assert s.link_start >= s.start + latency
        assert s.link_end <= s.end
    # The link's byte timeline: back to back, in issue order, never two transfers at once.
    for prev, cur in zip(slots, slots[1:]):
        assert cur.link_start >= prev.link_end
    # Black box: in any window [a, b], the transfers issued at or after a and ready by b moved
    # all their bytes inside it, so together at most link bandwidth x (b - a). Windows from
    # each issue time to each ready time are the extreme ones.
    for a in {t for _, t in transfers}:
        for b in {s.end for s in slots if s.end >= a}:
            moved = sum(n for (n, t), s in zip(transfers, slots) if t >= a and s.end <= b)
            assert moved <= link_bps * (b - a) * (1 + 1e-9) + 1e-3
    # And concurrency does not beat the link: the last transfer ends no earlier than all the
    # bytes take on it.
    first = min(t for _, t in transfers)
    total = sum(n for n, _ in transfers)
    assert max(s.end for s in slots) >= first + total / link_bps * (1 - 1e-9)


@settings(max_examples=100, deadline=None)
@given(transfers=_transfers)
def test_more_engines_overlap_latency_but_add_no_bandwidth(transfers):
    """Same sequence on h200 with 1 and with 2 engines: 2 finishes no later (latencies
    overlap) and no earlier than the link allows; the old 2-engine model could double it."""
    one = VirtualClock(hardware.get("h200", copy_engines=1))
    two = VirtualClock(hardware.get("h200"))
    end1 = max(one.transfer(n, t) for n, t in transfers)
    end2 = max(two.transfer(n, t) for n, t in transfers)
    assert end2 <= end1 * (1 + 1e-12)
    total = sum(n for n, _ in transfers)
    assert end2 >= min(t for _, t in transfers) + total / 40e9 * (1 - 1e-9)
    assert not math.isnan(end2)
