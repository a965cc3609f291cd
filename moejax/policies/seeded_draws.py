"""`noisy_oracle`'s perturbation for many groups at once, compiled: numpy's
`np.random.default_rng([seed, pass_id, target])` and the draws `NoisyOraclePrefetch._perturb`
takes from it (`random()`, `integers(n)`), written out so that a replay's whole stream of
predictions (`moejax/replay/stream_predictions.py`) costs microseconds a group instead of the
25 us that seeding a numpy generator costs (a 768-cell capture grid seeded ~30,000 of them in
each worker: 0.7 s of it).

The policy's definition stays `_perturb`, numpy's own generator; this is a second reading of
the same stream, held equal to it by `tests/test_seeded_draws.py` (random seeds, passes,
targets, precisions and truths, against numpy itself: that test, not this text, is the
check). What it reproduces, named as numpy's sources name it (`bit_generator.pyx`,
`_pcg64.pyx`, `pcg64.h`, `distributions.c`):
- `SeedSequence(entropy)`: a pool of four 32-bit words hashed from the entropy words, mixed
  all to all (`mix_entropy`), then `generate_state(4, uint64)` (`INIT_B`, `MULT_B`);
- `PCG64`: its 128-bit state seeded by `pcg64_set_seed` (state then increment, high words
  first), stepped before each output, the XSL-RR output;
- `Generator.random()`: the top 53 bits of one output; `Generator.integers(n)`: 0 without a
  draw when n == 1, else Lemire's bounded method on 32-bit halves of the outputs (the low half
  first, the high half kept for the next 32-bit draw).
Only entropy words below 2**32 are read here (each of `seed, pass_id, target` one word, as
numpy splits them): `fits` says whether a call may come here; anything else is numpy's.
"""

from __future__ import annotations

import numba
import numpy as np

# SeedSequence's constants (numpy/random/bit_generator.pyx).
_M32 = np.uint64(0xFFFFFFFF)
_INIT_A, _MULT_A = np.uint64(0x43B0D7E5), np.uint64(0x931E8875)
_INIT_B, _MULT_B = np.uint64(0x8B51F9DD), np.uint64(0x58F38DED)
_MIX_L, _MIX_R = np.uint64(0xCA01F9DD), np.uint64(0x4973F715)
_XSHIFT = np.uint64(16)
# PCG64's 128-bit multiplier, high and low words.
_MUL_HI, _MUL_LO = np.uint64(2549297995355413924), np.uint64(4865540595714422341)
_ONE, _U32, _U63, _U58, _U11 = (np.uint64(1), np.uint64(32), np.uint64(63), np.uint64(58),
                                np.uint64(11))
_TWO_53 = 1.0 / 9007199254740992.0
_MAX_WORD = 1 << 32


def fits(*words: int) -> bool:
    """Whether every entropy word is one 32-bit word (a non-negative int below 2**32)."""
    return all(0 <= int(w) < _MAX_WORD for w in words)


@numba.njit(cache=True, inline="always")
def _hashmix(value, hash_const):
    value ^= hash_const
    hash_const = (hash_const * _MULT_A) & _M32
    value = (value * hash_const) & _M32
    return value ^ (value >> _XSHIFT), hash_const


@numba.njit(cache=True, inline="always")
def _mix(x, y):
    result = (_MIX_L * x - _MIX_R * y) & _M32
    return result ^ (result >> _XSHIFT)


@numba.njit(cache=True, inline="always")
def _mulhi(a, b):
    """The high 64 bits of the 128-bit product of two 64-bit words."""
    a0, a1, b0, b1 = a & _M32, a >> _U32, b & _M32, b >> _U32
    low = a0 * b0
    mid1 = a1 * b0 + (low >> _U32)
    mid2 = a0 * b1 + (mid1 & _M32)
    return a1 * b1 + (mid1 >> _U32) + (mid2 >> _U32)


@numba.njit(cache=True, inline="always")
def _step(hi, lo, inc_hi, inc_lo):
    """PCG's state * multiplier + increment, modulo 2**128."""
    new_lo = lo * _MUL_LO
    new_hi = _mulhi(lo, _MUL_LO) + lo * _MUL_HI + hi * _MUL_LO
    out_lo = new_lo + inc_lo
    return new_hi + inc_hi + (_ONE if out_lo < new_lo else np.uint64(0)), out_lo


@numba.njit(cache=True)
def _seeded(words):
    """PCG64's state `(hi, lo, inc_hi, inc_lo)` for `default_rng(list(words))`."""
    pool = np.zeros(4, np.uint64)
    hash_const = _INIT_A
    for i in range(4):
        pool[i], hash_const = _hashmix(words[i] if i < len(words) else np.uint64(0),
                                       hash_const)
    for src in range(4):
        for dst in range(4):
            if src != dst:
                hashed, hash_const = _hashmix(pool[src], hash_const)
                pool[dst] = _mix(pool[dst], hashed)
    state = np.zeros(8, np.uint64)  # generate_state(4, uint64): eight 32-bit words
    hash_const = _INIT_B
    for i in range(8):
        value = pool[i % 4] ^ hash_const
        hash_const = (hash_const * _MULT_B) & _M32
        value = (value * hash_const) & _M32
        state[i] = value ^ (value >> _XSHIFT)
    seed_hi, seed_lo = state[0] | (state[1] << _U32), state[2] | (state[3] << _U32)
    inc_hi, inc_lo = state[4] | (state[5] << _U32), state[6] | (state[7] << _U32)
    # pcg64_srandom_r: the increment is odd; step, add the seed, step.
    inc_hi, inc_lo = (inc_hi << _ONE) | (inc_lo >> _U63), (inc_lo << _ONE) | _ONE
    hi, lo = _step(np.uint64(0), np.uint64(0), inc_hi, inc_lo)
    lo2 = lo + seed_lo
    hi = hi + seed_hi + (_ONE if lo2 < lo else np.uint64(0))
    hi, lo = _step(hi, lo2, inc_hi, inc_lo)
    return hi, lo, inc_hi, inc_lo


@numba.njit(cache=True, inline="always")
def _output(hi, lo):
    """PCG64's XSL-RR output of a state."""
    x = hi ^ lo
    rot = hi >> _U58
    return (x >> rot) | (x << ((np.uint64(64) - rot) & _U63))


@numba.njit(cache=True)
def perturb_groups(seed, precision, num_experts, pass_ids, targets, experts, bounds):
    """`_perturb(experts[bounds[g]:bounds[g + 1]], targets[g], pass_ids[g])` for every group
    `g`, concatenated (`fits(seed, pass_id, target)` for every group: the caller's check)."""
    out = np.empty(len(experts), np.int64)
    wrong = np.empty(num_experts, np.int64)
    is_true = np.zeros(num_experts, np.bool_)
    words = np.zeros(3, np.uint64)
    words[0] = np.uint64(seed)
    for g in range(len(pass_ids)):
        a, b = bounds[g], bounds[g + 1]
        words[1], words[2] = np.uint64(pass_ids[g]), np.uint64(targets[g])
        hi, lo, inc_hi, inc_lo = _seeded(words)
        has32, half = False, np.uint64(0)  # the 32-bit draw's buffer (pcg64_next32)
        for i in range(a, b):
            is_true[experts[i]] = True
        n_wrong = 0
        for e in range(num_experts):
            if not is_true[e]:
                wrong[n_wrong] = e
                n_wrong += 1
        for i in range(a, b):
            is_true[experts[i]] = False
        for i in range(a, b):
            hi, lo = _step(hi, lo, inc_hi, inc_lo)  # random(): one output's top 53 bits
            if float(_output(hi, lo) >> _U11) * _TWO_53 < precision or n_wrong == 0:
                out[i] = experts[i]
                continue
            pick = 0
            if n_wrong > 1:  # integers(n_wrong): Lemire's method on 32-bit draws
                excl = np.uint64(n_wrong)
                threshold = (_M32 - (excl - _ONE)) % excl
                first = True
                while True:
                    if has32:
                        draw, has32 = half, False
                    else:
                        hi, lo = _step(hi, lo, inc_hi, inc_lo)
                        full = _output(hi, lo)
                        draw, half, has32 = full & _M32, full >> _U32, True
                    m = draw * excl
                    leftover = m & _M32
                    if first and leftover >= excl:
                        break  # (`excl` bounds the threshold: no rejection possible)
                    first = False
                    if leftover >= threshold:
                        break
                pick = np.int64(m >> _U32)
            out[i] = wrong[pick]
            for j in range(pick, n_wrong - 1):  # list.pop(pick)
                wrong[j] = wrong[j + 1]
            n_wrong -= 1
    return out
