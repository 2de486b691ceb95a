"""Interleaved timing and a robust estimate of a paired difference.

What ``hookwrap demo`` uses to tell hookwrap's own cost per step apart from the
callbacks' work on a shared machine. Its variants (the hooked step, the same step
with the callbacks called by hand, the step without them) run interleaved, one
call each in turn and in a rotating order, so that whatever the machine does at a
moment falls on all of them alike; each call is timed on its own. The estimate of
``a - b`` is the median of the differences of the calls paired in each turn: a
step the scheduler preempted, or a burst of load, moves one pair, not the median.
Its confidence interval is distribution-free (order statistics of the sorted
differences, from the binomial distribution of how many fall below the median),
and it says when the machine was too noisy to tell: when the interval includes
zero, or is wider than the estimate itself.
"""

from __future__ import annotations

import math
import random
import time
from fractions import Fraction
from typing import Any, Callable, NamedTuple, Sequence

__all__ = ["Estimate", "block_minima", "differences", "interleaved", "median_interval", "paired"]


class Estimate(NamedTuple):
    """The median of paired differences, with its spread."""

    value: float  # the median of the differences
    low: float  # the confidence interval of that median (order statistics)
    high: float
    q1: float  # the differences' lower and upper quartile: their spread
    q3: float
    n: int  # how many pairs
    confidence: float  # the exact coverage of [low, high] (at least the one asked where n allows)

    @property
    def noisy(self) -> bool:
        """Too noisy to say: the interval includes zero, or is wider than the estimate."""
        return self.low <= 0.0 <= self.high or (self.high - self.low) > abs(self.value)

    def why_noisy(self) -> str:
        """Why ``noisy`` is true ('' where it is not)."""
        if self.low <= 0.0 <= self.high:
            return f"its {self.confidence:.0%} interval includes zero"
        if (self.high - self.low) > abs(self.value):
            return f"its {self.confidence:.0%} interval is wider than the estimate"
        return ""


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values (as statistics.quantiles' 'inclusive')."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median_interval(n: int, confidence: float = 0.95) -> tuple[int, int, float]:
    """0-based indices ``(i, j)`` of the sorted sample whose values bound an interval
    of the median with at least ``confidence`` coverage, and that coverage: the
    order statistics ``x_(r) .. x_(n-r+1)`` (1-based) of the sign test, with the
    largest ``r`` for which ``1 - 2 P(B < r) >= confidence``, ``B ~ Binomial(n, 1/2)``;
    exact, in integer arithmetic. Where n is too small to reach ``confidence``,
    the full range, with the lower coverage it has."""
    if n < 1:
        raise ValueError("median_interval: no samples")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"median_interval: confidence must be between 0 and 1, got {confidence}")
    total = 1 << n
    tail = Fraction(1.0 - confidence).limit_denominator(10**6) / 2
    below, r = 0, 0  # below = sum of C(n, i) for i < r, i.e. P(B < r) * 2**n
    while r < (n + 1) // 2:
        nxt = below + math.comb(n, r)
        if nxt > tail * total:
            break
        below, r = nxt, r + 1
    if r == 0:  # the full range: below its confidence
        return 0, n - 1, 1.0 - 2 / total
    return r - 1, n - r, 1.0 - 2 * below / total


def paired(differences: Sequence[float], confidence: float = 0.95) -> Estimate:
    """The robust estimate of a paired difference: the median of ``differences``
    (``a_i - b_i`` for the calls paired in each turn), its distribution-free
    ``confidence`` interval, and the quartiles of the differences."""
    ordered = sorted(float(d) for d in differences)
    if not ordered:
        raise ValueError("paired: no differences")
    n = len(ordered)
    i, j, achieved = median_interval(n, confidence)
    return Estimate(value=_quantile(ordered, 0.5), low=ordered[i], high=ordered[j],
                    q1=_quantile(ordered, 0.25), q3=_quantile(ordered, 0.75), n=n,
                    confidence=achieved)


def interleaved(variants: Sequence[Callable[[Any], Any]], inputs: Sequence[Any], turns: int,
                run: int = 1, seed: int = 0,
                clock: Callable[[], float] = time.perf_counter) -> list[list[float]]:
    """Seconds of each call of each variant: ``turns`` turns, in each of which every
    variant is called ``run`` times in a row on the same inputs (the next ``run`` of
    ``inputs``, cyclically), the variants in an order shuffled from turn to turn
    (seeded: the same every run), so that no variant always runs first, or after
    the same one, or on the same phase of a callback's every-N work (its counters
    advance in both). A run of calls in a row is what a loop does: its later calls
    find their code and data as warm as a loop of that variant alone would. Returns
    one list of ``turns * run`` times per variant, index-aligned: ``times[a][k] -
    times[b][k]`` pairs calls made on the same input in the same turn."""
    count = len(variants)
    times: list[list[float]] = [[0.0] * (turns * run) for _ in range(count)]
    order = list(range(count))
    shuffle = random.Random(seed).shuffle
    for turn in range(turns):
        first = turn * run
        items = [inputs[(first + i) % len(inputs)] for i in range(run)]
        shuffle(order)
        for v in order:
            fn, out = variants[v], times[v]
            for i, item in enumerate(items, first):
                start = clock()
                fn(item)
                out[i] = clock() - start
    return times


def block_minima(a: Sequence[float], b: Sequence[float], size: int) -> list[float]:
    """Min-of-blocks differences: ``min(a[block]) - min(b[block])`` for each block of
    ``size`` consecutive turns (a last, shorter block is left out). The fastest call
    of a block is one that nothing preempted or slowed (another process, a page
    fault, a callback's work every N steps); their difference is the difference of
    the two variants' own work."""
    if len(a) != len(b):
        raise ValueError(f"block_minima: {len(a)} and {len(b)} samples do not pair")
    if size < 1:
        raise ValueError(f"block_minima: size must be at least 1, got {size}")
    return [min(a[i:i + size]) - min(b[i:i + size]) for i in range(0, len(a) - size + 1, size)]


def differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a[t] - b[t]`` for each turn."""
    if len(a) != len(b):
        raise ValueError(f"differences: {len(a)} and {len(b)} samples do not pair")
    return [x - y for x, y in zip(a, b)]
