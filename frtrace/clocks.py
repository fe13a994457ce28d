"""Per-rank clock offsets, estimated from matched collectives.

Takes CollectiveMatches; returns {rank: offset_ns}. Every member of a collective sees
it finish at nearly the same real moment, so the median, over collectives every
issuer completed, of a rank's completion time minus the collective's median
completion time is that rank's clock offset. A rank's aligned time is its own time
minus its offset. Ranks with no such collective are absent (empty without timing).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Iterable


def estimate_clock_offsets(collectives: Iterable) -> dict:
    samples = defaultdict(list)
    for match in collectives:
        if match.not_issued or len(match.calls) < 2:
            continue
        if not next(iter(match.calls.values()))[-1].time_completed_ns:
            continue  # timing off (as a rule for every op): nothing to learn here
        times = {rank: entries[-1].time_completed_ns for rank, entries in match.calls.items()}
        if not all(times.values()):
            continue
        # Relative to the earliest: the median of an even count is a float, and a float
        # of an epoch in ns would round to hundreds of ns.
        base = min(times.values())
        middle = statistics.median(t - base for t in times.values())
        for rank, completed in times.items():
            samples[rank].append(completed - base - middle)
    return {rank: statistics.median(values) for rank, values in samples.items()}
