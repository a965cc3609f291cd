"""`s3fifo` eviction (`moejax/policies/s3fifo.py`), step by step against S3-FIFO's rules, and
the conformance kit on it."""

from __future__ import annotations

from moejax.policies import build, conformance


def _every(key) -> bool:
    return True


def test_new_experts_leave_from_the_small_queue_unless_used_again():
    p = build("eviction", "s3fifo", num_slots=10)  # small queue: 1 slot, ghost: 9 keys
    for key in [(0, 1), (0, 2), (0, 3)]:
        p.on_admit(key, 0, False)
        p.on_access(key, 0)  # the demand fetch's own use: not a reuse
    assert list(p.small) == [(0, 1), (0, 2), (0, 3)] and not p.main
    p.on_access((0, 1), 0)  # (0, 1) used again
    # The small queue holds its share: its oldest, used again, goes to the main queue, and the
    # next oldest, never used again, is the victim.
    assert p.victim(0, _every) == (0, 2)
    assert list(p.main) == [(0, 1)] and p.uses[(0, 1)] == 0
    p.on_evict((0, 2))
    assert list(p.ghost) == [(0, 2)]
    # Back from the ghost: straight into the main queue.
    p.on_admit((0, 2), 0, False)
    assert list(p.main) == [(0, 1), (0, 2)] and list(p.small) == [(0, 3)]
    # The running wave's experts keep their places.
    assert p.victim(0, lambda k: k != (0, 3)) == (0, 1)


def test_the_main_queue_gives_a_used_expert_another_round():
    p = build("eviction", "s3fifo", num_slots=10)  # small queue: 1 slot
    for key in [(1, 1), (1, 3)]:
        p.on_admit(key, 1, True)  # prefetched: no demand use follows
        p.on_access(key, 1)  # then used once
    assert p.victim(1, lambda k: False) is None and not p.main  # nothing may go: none moves
    # Both were used in the small queue: both go to the main queue (uses reset), whose
    # oldest, unused since, is the victim.
    assert p.victim(1, _every) == (1, 1)
    assert list(p.main) == [(1, 1), (1, 3)] and not p.small
    p.on_access((1, 1), 1)
    p.on_access((1, 1), 1)
    # (1, 1), used twice, goes round once more with one use fewer; (1, 3) is the victim.
    assert p.victim(1, _every) == (1, 3)
    assert list(p.main) == [(1, 3), (1, 1)] and p.uses[(1, 1)] == 1


def test_the_conformance_kit_passes_it():
    report = conformance.check("moejax.policies.s3fifo:S3FIFO", captures=())
    assert report.policy == "eviction s3fifo" and report.passed, report.table()
