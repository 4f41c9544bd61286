"""Every site's batch order of a round in one vectorised call, bit for bit numpy's.

A site's order is ``np.random.default_rng(seed).permutation(n)`` per local epoch, its seed
``SeedSequence([run_seed, round, site]).generate_state(1)`` (``emulate.site_seed``). Built one
site at a time that is ~90 us of generator construction per site: 0.9 s of a 10,000-site round.
Here the same arithmetic runs on arrays over all sites: numpy's ``SeedSequence`` hash (32-bit
words), ``PCG64`` (128-bit LCG with XSL-RR output, in 32-bit limbs) and ``Generator.shuffle``
(Fisher-Yates with ``random_interval``'s masked rejection, on buffered 32-bit draws). The
results equal numpy's exactly (tests/unit/test_batch_orders.py), so a run's training does not
change; the per-site path stays for rounds where looping is cheaper (few sites, long partitions).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["epoch_orders", "seed_words", "site_seeds"]

_U32 = np.uint32
_M32 = np.uint64(0xFFFFFFFF)
# numpy's SeedSequence constants (numpy/random/bit_generator.pyx)
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = _U32(0xCA01F9DD), _U32(0x4973F715), 4
# PCG64's default 128-bit multiplier, as 32-bit limbs, least significant first
_PCG_MULT = [(0x2360ED051FC65DA44385DF649FCCF645 >> (32 * i)) & 0xFFFFFFFF for i in range(4)]


def _shift(v: NDArray) -> NDArray:
    return v ^ (v >> _U32(16))


def seed_words(entropy: NDArray, n_words: int) -> NDArray:
    """``SeedSequence(row).generate_state(n_words)`` for each row of ``entropy`` ([k, m] words
    < 2**32, m <= 4: one word per integer below 2**32), as [k, n_words] uint32."""
    entropy = np.asarray(entropy, dtype=_U32)
    k, m = entropy.shape
    if m > _POOL:
        raise ValueError("at most 4 entropy words")
    const = _INIT_A

    def hashmix(value: NDArray) -> NDArray:
        nonlocal const
        value = value ^ _U32(const)
        const = (const * _MULT_A) & 0xFFFFFFFF
        return _shift(value * _U32(const))

    zero = np.zeros(k, dtype=_U32)
    with np.errstate(over="ignore"):
        pool = [hashmix(entropy[:, i] if i < m else zero) for i in range(_POOL)]
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = _shift(_MIX_L * pool[dst] - _MIX_R * hashmix(pool[src]))
        const = _INIT_B
        out = np.empty((k, n_words), dtype=_U32)
        for i in range(n_words):
            out[:, i] = _shift(
                (pool[i % _POOL] ^ _U32(const)) * _U32((const * _MULT_B) & 0xFFFFFFFF)
            )
            const = (const * _MULT_B) & 0xFFFFFFFF
    return out


def site_seeds(run_seed: int, round_index: int, sites: Sequence[int] | NDArray) -> NDArray:
    """``emulate.site_seed`` of every site at once ([k] int64): one hash over arrays when all
    three are in [0, 2**32) (one entropy word each), numpy's ``SeedSequence`` per site if not."""
    s = np.asarray(sites, dtype=np.int64).reshape(-1)
    words = (run_seed, round_index, *((s.min(), s.max()) if s.size else ()))
    if not all(0 <= int(v) < 2**32 for v in words):
        return np.array(
            [
                np.random.SeedSequence([run_seed, round_index, int(i)]).generate_state(1)[0]
                for i in s.tolist()
            ],
            dtype=np.int64,
        )
    entropy = np.empty((s.size, 3), dtype=_U32)
    entropy[:, 0], entropy[:, 1], entropy[:, 2] = run_seed, round_index, s
    return seed_words(entropy, 1)[:, 0].astype(np.int64)


class _Pcg64:
    """Many PCG64 streams (numpy's, seeded as ``default_rng(seed)``) with ``next_uint32``."""

    def __init__(self, seeds: NDArray) -> None:
        words = seed_words(np.asarray(seeds, dtype=_U32).reshape(-1, 1), 8).astype(np.uint64)
        # generate_state(4, uint64) -> (init hi, init lo, inc hi, inc lo), little-endian words
        init = [words[:, 2], words[:, 3], words[:, 0], words[:, 1]]  # limbs, low first
        inc = [words[:, 6], words[:, 7], words[:, 4], words[:, 5]]
        # inc = (initseq << 1) | 1, over 128 bits
        self.inc = [
            ((inc[i] << np.uint64(1)) & _M32) | (inc[i - 1] >> np.uint64(31) if i else 1)
            for i in range(4)
        ]
        k = len(seeds)
        self.state = [np.zeros(k, dtype=np.uint64) for _ in range(4)]
        idx = np.arange(k)
        self._step(idx)
        self.state = _add(self.state, init)
        self._step(idx)
        self.has32 = np.zeros(k, dtype=bool)
        self.buf = np.zeros(k, dtype=np.uint64)

    def _step(self, idx: NDArray) -> None:
        """state = state * MULT + inc (mod 2**128) for the streams ``idx``."""
        a = [limb[idx] for limb in self.state]
        cols = [np.zeros(len(idx), dtype=np.uint64) for _ in range(4)]
        for i in range(4):
            for j in range(4 - i):
                p = a[i] * np.uint64(_PCG_MULT[j])
                cols[i + j] += p & _M32
                if i + j < 3:
                    cols[i + j + 1] += p >> np.uint64(32)
        new = _add(_carry(cols), [limb[idx] for limb in self.inc])
        for limb, value in zip(self.state, new, strict=True):
            limb[idx] = value

    def next32(self, idx: NDArray) -> NDArray:
        """``pcg64_next32`` for the streams ``idx`` (a draw's low half, its high half next)."""
        out = self.buf[idx]
        fresh = idx[~self.has32[idx]]
        if fresh.size:
            self._step(fresh)
            s = [limb[fresh] for limb in self.state]
            hi, lo = (s[3] << np.uint64(32)) | s[2], (s[1] << np.uint64(32)) | s[0]
            x, rot = hi ^ lo, hi >> np.uint64(58)
            draw = (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))
            self.buf[fresh] = draw >> np.uint64(32)
            out[~self.has32[idx]] = draw & _M32
        self.has32[idx] = ~self.has32[idx]
        return out


def _carry(cols: list[NDArray]) -> list[NDArray]:
    out: list[NDArray] = []
    carry: NDArray | np.uint64 = np.uint64(0)
    for c in cols:
        c = c + carry
        out.append(c & _M32)
        carry = c >> np.uint64(32)
    return out


def _add(a: list[NDArray], b: list[NDArray]) -> list[NDArray]:
    return _carry([x + y for x, y in zip(a, b, strict=True)])


def epoch_orders(seeds: NDArray, sizes: NDArray, epochs: int) -> NDArray:
    """[k, epochs, max(sizes)] int64: row (s, e) is ``default_rng(seeds[s])``'s e-th
    ``permutation(sizes[s])`` (drawn one after another from one generator), -1 beyond it."""
    sizes = np.asarray(sizes, dtype=np.int64)
    k, width = sizes.size, int(sizes.max()) if sizes.size else 0
    if width >= 2**32:
        raise ValueError("partitions of 2**32 samples or more take numpy's own generator")
    gen = _Pcg64(np.asarray(seeds))
    cols = np.arange(width)
    out = np.empty((k, epochs, width), dtype=np.int64)
    for e in range(epochs):
        perm = np.where(cols < sizes[:, None], cols, -1)
        for t in range(width - 1):  # Fisher-Yates: i = n-1 down to 1, j = random_interval(i)
            top = sizes - 1 - t
            live = np.flatnonzero(top >= 1)
            if not live.size:
                break
            bound = top[live].astype(np.uint64)
            mask = bound.copy()
            for s in (1, 2, 4, 8, 16):
                mask |= mask >> np.uint64(s)
            pick = np.empty(live.size, dtype=np.int64)
            pending = np.arange(live.size)
            while pending.size:  # rejection: draw again where the masked value exceeds i
                v = gen.next32(live[pending]) & mask[pending]
                ok = v <= bound[pending]
                pick[pending[ok]] = v[ok].astype(np.int64)
                pending = pending[~ok]
            i = top[live]
            a, b = perm[live, i], perm[live, pick]
            perm[live, i], perm[live, pick] = b, a
        out[:, e] = perm
    return out
