"""Stragglers: ranks that issue collectives late, throughout, lately, or again and again.

Takes `Facts`; returns at most one `straggler` finding (a warning, never what makes a
job FAULT) naming the late ranks and their typical lateness, from `time_created_ns` of
collectives every member issued alike and finished: late at most of them
(`_consistently_late`), at the newest in every group (`_lately_late`), or at a good share
in every group (`_often_late`), by more than the job's own noise (`_threshold`).
Creation times are host wall clocks (one clock per host, NTP apart between hosts); no
per-rank offset is fitted, since the only other times a dump holds, `time_discovered_*`,
are watchdog ticks (about 100 ms, each rank with its own phase) and would invent
lateness rather than remove it. They do bound it: a rank's peers wait for it at least
as long as it is late (`_waited_for`), so a host clock set apart from the others' makes
no straggler. Dumps whose times are not on a wall clock (the CUPTI monitor's native
clock) get no verdict.
"""

from __future__ import annotations

import statistics
from array import array
from collections import Counter, defaultdict
from functools import partial
from itertools import chain, repeat
from operator import sub, truediv
from typing import NamedTuple, Sequence

from frtrace.diagnosis.facts import Facts, new_finding, took_part_unrecorded
from frtrace.diagnosis.finding import Finding
from frtrace.diagnosis.sampling import first_value_columns
from frtrace.diagnosis.side_by_side import by_views
from frtrace.match.matcher import CollectiveMatch, GroupView
from frtrace.table.rank_dump import clocks_compare
from frtrace.wording import ranks_text

STRAGGLER_MIN_MS = 10.0
STRAGGLER_MIN_SAMPLES = 3
STRAGGLER_SAMPLE_PER_GROUP = 64
STRAGGLER_RECENT_MIN = 8  # newest collectives of each group a rank late lately is late at
STRAGGLER_OFTEN_SHARE = 1 / 4  # of each group's collectives a rank often late is late at
STRAGGLER_OFTEN_MIN = 6  # collectives a rank often late is late at, at least ("again and again")
STRAGGLER_NOISE_RANKS = 256  # ranks the job's noise is read over, spread over the job


def late_arrivals(facts: Facts, processes: int = 1) -> list[Finding]:
    """The rule: ranks late to most of the collectives they were sampled in, to the newest
    in every group, or to a good share in every group, where their peers waited. With
    `processes` above 1 the groups are sampled in shares at once, each other than the
    first in a forked child (`side_by_side.by_views`): the same finding, sooner."""
    if not clocks_compare(facts.seen):
        return []  # each host's CUPTI clock has its own origin: lateness would be that offset
    samples = _samples(facts, processes)
    typical, lateness = _typical_lateness(samples)
    if len(typical) < 3:
        return []
    threshold = _threshold(typical)
    if not _any_late(samples, typical, lateness, threshold):
        return []  # the job's noise could only raise the threshold: no need to read it
    threshold = max(threshold, 5 * _noise_ms(lateness))
    late = _consistently_late(typical, lateness, threshold)
    lately = _lately_late(samples, set(late), threshold)
    late = _waited_for(facts, typical, late)
    lately = {rank: lately[rank] for rank in _waited_for(facts, lately, list(lately), recent=True)}
    often = _often_late(samples, set(late) | set(lately), threshold)
    often_ms = {rank: ms for rank, (ms, _) in often.items()}
    often = {rank: often[rank] for rank in _waited_for(facts, often_ms, list(often), late_from=threshold / 2)}
    if not late and not lately and not often:
        return []
    return [_straggler_finding(late, typical, lateness, lately, often)]


def _straggler_finding(late: list[int], typical: dict[int, float], lateness: dict[int, array[float]],
                       lately: dict[int, float], often: dict[int, tuple[float, float]]) -> Finding:
    """The finding naming the ranks late throughout (`late`), those late only over their
    newest collectives in every group (`lately`: rank -> typical lateness there), and those
    late at a good share of their collectives in every group (`often`: rank -> typical
    lateness when late, and the share)."""
    ms = {**{rank: when_late for rank, (when_late, _) in often.items()}, **lately,
          **{rank: typical[rank] for rank in late}}
    ranks = sorted(ms)
    parts = []
    if late:
        parts.append(f"{ranks_text(late)} consistently {'issues' if len(late) == 1 else 'issue'} collectives late: "
                     "typically " + ", ".join(f"rank {r} +{ms[r]:.1f} ms" for r in late) + " behind the ranks on time")
    if lately:
        recent = sorted(lately)
        one = len(recent) == 1
        parts.append(f"{ranks_text(recent)} {'has' if one else 'have'} issued {'its' if one else 'their'} newest "
                     f"collectives late in every group, on time before: typically "
                     + ", ".join(f"rank {r} +{ms[r]:.1f} ms" for r in recent) + " behind the ranks on time")
    if often:
        now_and_then = sorted(often)
        one = len(now_and_then) == 1
        parts.append(f"{ranks_text(now_and_then)} {'issues' if one else 'issue'} collectives late again and again in "
                     "every group, on time in between: " + ", ".join(
                         f"rank {r} at {often[r][1]:.0%} of them, typically +{ms[r]:.1f} ms" for r in now_and_then)
                     + " behind the ranks on time")
    evidence: dict[str, object] = {
        "lateness_ms": {str(r): round(ms[r], 3) for r in ranks},
        "samples": {str(r): len(lateness[r]) for r in ranks},
        "worst_ms": round(max(ms.values()), 3),
    }
    if lately:
        evidence["late_lately"] = sorted(lately)
    if often:
        evidence["late_often"] = {str(r): round(often[r][1], 3) for r in sorted(often)}
    return new_finding(
        "straggler", "stragglers.late_arrivals", None, op=None, collective_seq_id=None, p2p_seq_id=None,
        ranks=tuple(ranks), suspect_ranks=tuple(ranks), message="; ".join(parts), evidence=evidence,
    )


class Samples(NamedTuple):
    """What some groups' sampled collectives say of each rank's lateness."""

    of_rank: dict[int, array[float]]  # rank -> ms after the on-time arrival, at each collective sampled
    groups_of: dict[int, int]  # rank -> how many groups it was sampled in
    in_wide_group: set[int]  # ranks sampled in a group of more than two
    # rank -> how many groups hold a run of its collectives (those every member issued, in
    # order) of twice STRAGGLER_RECENT_MIN or more; and, where the newest part of such a
    # run (`_newest`) is late by STRAGGLER_MIN_MS / 2 throughout, that part's lateness (a
    # rank late lately in every such group has one per group: `_lately_late`)
    long_runs: dict[int, int]
    newest_late: dict[int, list[list[float]]]
    # rank -> how many groups hold STRAGGLER_MIN_SAMPLES or more of its collectives; and
    # per such run where it is late by STRAGGLER_MIN_MS / 2 at one at least (at
    # STRAGGLER_OFTEN_SHARE of a long run), the run's length, its group's size and those
    # samples (`_often_late`)
    sampled_runs: dict[int, int]
    late_in_runs: dict[int, list[tuple[int, int, list[float]]]]


def _samples(facts: Facts, processes: int) -> Samples:
    """The Samples of every group: in `processes` shares of the groups at once, where a
    fork may pay (`side_by_side.by_views`), merged in the groups' order. A rank's
    statistics below do not depend on the order of its samples."""
    parts = by_views(partial(_samples_of_views, facts), facts.device.views, processes)
    if len(parts) == 1:
        return parts[0]
    merged = Samples({}, {}, set(), {}, {}, {}, {})
    for part in parts:
        for rank, count in part.long_runs.items():
            merged.long_runs[rank] = merged.long_runs.get(rank, 0) + count
        for rank, newest in part.newest_late.items():
            merged.newest_late.setdefault(rank, []).extend(newest)
        for rank, count in part.sampled_runs.items():
            merged.sampled_runs[rank] = merged.sampled_runs.get(rank, 0) + count
        for rank, runs in part.late_in_runs.items():
            merged.late_in_runs.setdefault(rank, []).extend(runs)
        for rank, values in part.of_rank.items():
            if rank in merged.of_rank:
                merged.of_rank[rank] += values
            else:
                merged.of_rank[rank] = values
        for rank, count in part.groups_of.items():
            merged.groups_of[rank] = merged.groups_of.get(rank, 0) + count
        merged.in_wide_group.update(part.in_wide_group)
    return merged


def _samples_of_views(facts: Facts, views: Sequence[GroupView]) -> Samples:
    clean = [m for view in views for m in _recent_clean(facts.collectives_of(view), facts.reliable)]
    return _lateness_samples(clean)


def _threshold(typical: dict[int, float]) -> float:
    """The lateness that makes a straggler: STRAGGLER_MIN_MS, and five times the ranks'
    median spread; and then five times the job's noise (`_noise_ms`), where some rank is
    late by this much (`_any_late`)."""
    return max(STRAGGLER_MIN_MS, 5 * statistics.median(abs(v) for v in typical.values()))


def _any_late(samples: Samples, typical: dict[int, float], lateness: dict[int, array[float]],
              threshold: float) -> bool:
    """Whether any rank is late by `threshold` in one of the three ways, before the peers'
    waits are read: each way names fewer ranks with a higher threshold."""
    return bool(_consistently_late(typical, lateness, threshold) or _lately_late(samples, set(), threshold)
                or _often_late(samples, set(), threshold))


def _consistently_late(typical: dict[int, float], lateness: dict[int, array[float]], threshold: float) -> list[int]:
    """The ranks typically late by more than `threshold`, and late on at least two thirds
    of their collectives, not on one bad step."""
    return sorted(
        r for r, ms in typical.items()
        if ms >= threshold and 3 * sum(x >= threshold / 2 for x in lateness[r]) >= 2 * len(lateness[r])
    )


def _newest(run: Sequence[float]) -> Sequence[float]:
    """The newest part of a group's run of samples that a rank late lately must be late
    throughout: STRAGGLER_RECENT_MIN of them (an end-of-job pause on one rank, a
    checkpoint, a log line, delays an op or two)."""
    return run[len(run) - STRAGGLER_RECENT_MIN:]


def _lately_late(samples: Samples, late: set[int], threshold: float) -> dict[int, float]:
    """rank -> its typical lateness over its newest collectives, for the ranks not `late`
    throughout that were late at each of their newest collectives (`_newest`) in every
    group that holds twice that many of theirs (two groups at least), by `threshold`
    typically: a rank that became slow within the dumps' window. A rank that merely
    waited for one is late only where it then meets others, not in every group."""
    found = {}
    for rank, newest_parts in samples.newest_late.items():
        if rank in late or len(newest_parts) < 2 or len(newest_parts) != samples.long_runs.get(rank):
            continue
        newest = [x for part in newest_parts for x in part]
        if min(newest) >= threshold / 2 and statistics.median(newest) >= threshold:
            found[rank] = statistics.median(newest)
    return found


def _noise_ms(lateness: dict[int, array[float]]) -> float:
    """How late ranks arrive now and then in this job, stragglers aside: the median over
    the ranks of each one's upper quartile of lateness (over STRAGGLER_NOISE_RANKS ranks
    spread over the job, where it has more). A healthy job whose ranks arrive tens of ms
    apart at random (busy hosts) has every rank late at a good share of its collectives,
    and, where a rank has few samples, some late at most of them by chance: a straggler
    must stand out from that."""
    ranks = sorted(lateness)
    ranks = ranks[::max(1, len(ranks) // STRAGGLER_NOISE_RANKS)]
    return statistics.median(sorted(lateness[rank])[(3 * len(lateness[rank])) // 4] for rank in ranks)


def _often_late(samples: Samples, named: set[int], threshold: float) -> dict[int, tuple[float, float]]:
    """rank -> (its typical lateness when late, the share of its collectives it was late
    at), for the ranks not `named` already that were late by half `threshold` at
    STRAGGLER_OFTEN_SHARE or more of their sampled collectives (STRAGGLER_OFTEN_MIN at
    least), in every group it was sampled in (`_late_in_every_group`), by `threshold`
    typically: a rank slow now and then (a data loader, a throttled GPU)."""
    found = {}
    for rank, runs in samples.late_in_runs.items():
        if rank in named or len(runs) != samples.sampled_runs.get(rank):
            continue
        late_parts = _late_in_every_group(runs, threshold)
        when_late = [x for part in late_parts for x in part]
        share = len(when_late) / sum(length for length, _, _ in runs)
        if (len(when_late) >= STRAGGLER_OFTEN_MIN and share >= STRAGGLER_OFTEN_SHARE
                and statistics.median(when_late) >= threshold):
            found[rank] = (statistics.median(when_late), share)
    return found


def _late_in_every_group(runs: list[tuple[int, int, list[float]]], threshold: float) -> list[list[float]]:
    """A rank's samples late by half `threshold` in each of its groups' `runs` (length,
    group size, samples late by STRAGGLER_MIN_MS / 2), where it was late at one at least in
    each, at STRAGGLER_OFTEN_SHARE of those holding twice STRAGGLER_RECENT_MIN, in two
    groups at least or one of more than two ranks; none otherwise. A rank that waited for
    a straggler is late only where it then meets others, not in every group, and one
    two-rank group alone cannot say which of its two is late."""
    if len(runs) < 2 and runs[0][1] <= 2:
        return []
    parts = [[x for x in marked if x >= threshold / 2] for _, _, marked in runs]
    if all(part and _often_enough(len(part), length) for part, (length, _, _) in zip(parts, runs)):
        return parts
    return []


def _often_enough(late: int, length: int) -> bool:
    """Whether a rank late at `late` of a group's `length` sampled collectives is late
    there often enough: at STRAGGLER_OFTEN_SHARE of them, where the group holds twice
    STRAGGLER_RECENT_MIN or more (fewer say too little to ask a share of)."""
    return length < 2 * STRAGGLER_RECENT_MIN or late >= STRAGGLER_OFTEN_SHARE * length


def _waited_for(facts: Facts, typical: dict[int, float], late: list[int], recent: bool = False,
                late_from: float | None = None) -> list[int]:
    """Those of `late` whose peers waited for them as long as their lateness says, where
    their own clocks tell: a collective cannot finish before its last member issued it,
    so the members on time wait at least as long as it is late, and each reads that wait
    on its own clock (when it created the op, when its watchdog saw it finish). A host
    clock set apart from the others makes its ranks look as late as the offset at every
    collective while nobody waits for them. At each collective a rank's lateness is
    capped by the longest wait of any other member (not capped where some wait is not
    known); a rank stays late when the median of that reaches half its lateness, and
    STRAGGLER_MIN_MS. With `recent` (ranks late lately, `_lately_late`), only the newest
    part of each group's collectives is read, in every group; with `late_from` (ranks
    often late, `_often_late`), only the collectives a rank was late at by that much."""
    allowed: dict[int, list[float]] = {rank: [] for rank in late}
    # The narrowest groups first, until each rank has a group's sample: a straggler is
    # late in every group, and a job-wide group's collectives hold every rank's entry.
    views = sorted((view for view in facts.device.views if allowed.keys() & view.streams.keys()),
                   key=lambda view: len(view.streams))
    for view in views:
        wanted = {rank for rank in allowed.keys() & view.streams.keys()
                  if recent or len(allowed[rank]) < STRAGGLER_SAMPLE_PER_GROUP}
        if not wanted:
            continue
        in_view: dict[int, list[float]] = {rank: [] for rank in wanted} if recent else allowed
        for match in _recent_clean(facts.collectives_of(view), facts.reliable):
            times = {r: (entries[0].time_created_ns, entries[0].time_completed_ns) for r, entries in match.calls.items()}
            asked = wanted & times.keys()
            if not asked or len(times) < 2:
                continue
            on_time = _on_time([made for made, _ in times.values()])
            waits = sorted(((done - made) / 1e6, r) for r, (made, done) in times.items() if made and done)
            waited = {r for _, r in waits}
            for rank in asked:
                late_ms = (times[rank][0] - on_time) / 1e6
                if late_from is not None and late_ms < late_from:
                    continue
                # The longest wait of another member, where every other member's is known.
                others = [wait for wait, r in waits[-2:] if r != rank]
                known = len(waited - {rank}) == len(times) - 1
                in_view[rank].append(min(late_ms, others[-1]) if known and others else late_ms)
        if recent:
            for rank, run in in_view.items():
                allowed[rank].extend(_newest(run) if len(run) >= 2 * STRAGGLER_RECENT_MIN else ())
    return [rank for rank in late
            if len(allowed[rank]) < STRAGGLER_MIN_SAMPLES
            or statistics.median(allowed[rank]) >= max(STRAGGLER_MIN_MS, typical[rank] / 2)]


def _recent_clean(matches: list[CollectiveMatch], reliable: bool) -> list[CollectiveMatch]:
    """The group's newest collectives that every member issued alike and finished, at
    most STRAGGLER_SAMPLE_PER_GROUP: timing statistics need a sample, not every op, and
    the newest ops tell how ranks behave now."""
    clean = []
    for match in reversed(matches):
        if (match.disagreement is None and not match.no_dump
                and (not match.not_issued or took_part_unrecorded(match, reliable))
                and (not reliable or len(match.completed_ranks) == len(match.calls))):
            clean.append(match)
            if len(clean) == STRAGGLER_SAMPLE_PER_GROUP:
                break
    clean.reverse()
    return clean


def _on_time(created: Sequence[int]) -> float:
    """The on-time arrival at one collective, given when each member created it: the
    median arrival; with two members the earlier one, as a median of two would make both
    ranks half late and half early. (`_on_times` applies it to a block of collectives.)"""
    return min(created) if len(created) == 2 else statistics.median(created)


def _on_times(columns: Sequence[Sequence[int]]) -> list[float]:
    """_on_time of each collective of a block, given when each member created each
    (`columns[i][j]`: member i at collective j). The collectives of a block have the same
    members, so which rule applies is settled once, and each is sorted in C: a large job
    samples some 100,000 collectives."""
    arrivals = zip(*columns)
    if len(columns) == 2:
        return list(map(min, arrivals))
    return list(map(_median_of_sorted, map(sorted, arrivals)))


def _median_of_sorted(values: Sequence[float]) -> float:
    """statistics.median of values already sorted: the middle one, or the mean of the
    two middle ones (a float, as statistics.median gives)."""
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def _lateness_ms(created: Sequence[int], on_time: Sequence[float]) -> list[float]:
    """A rank's ms after the on-time arrival at each of some collectives, given when it
    created each (`created`) and when was on time there (`on_time`): (t - o) / 1e6 of
    each, in C."""
    return list(map(truediv, map(sub, created, on_time), repeat(1e6)))


def _lateness_samples(clean: list[CollectiveMatch]) -> Samples:
    """Each rank's lateness at each of `clean` it took part in (two-member groups
    included), and where it was sampled."""
    samples_of: dict[int, array[float]] = {}
    long_runs: Counter[int] = Counter()
    newest_late: dict[int, list[list[float]]] = defaultdict(list)
    sampled_runs: Counter[int] = Counter()
    late_in_runs: dict[int, list[tuple[int, int, list[float]]]] = defaultdict(list)
    sampled_in: dict[int, set[int]] = defaultdict(set)  # group id -> the ranks sampled there
    in_wide_group: set[int] = set()
    sample = [match for match in clean if len(match.calls) >= 2]
    # Read a column per rank and group (a large job samples some 100,000 collectives),
    # and kept so: a rank's samples are what the statistics below read.
    for block in first_value_columns(sample, "time_created_ns"):
        on_time = _on_times(block.columns)  # per collective, from its members' times
        for rank, created in zip(block.ranks, block.columns):
            late = _lateness_ms(created, on_time)
            if rank in samples_of:
                samples_of[rank].extend(late)
            else:
                samples_of[rank] = array("d", late)
            if len(block.matches) >= 2 * STRAGGLER_RECENT_MIN:  # a group's run, in order
                long_runs[rank] += 1
                newest = _newest(late)
                if min(newest) >= STRAGGLER_MIN_MS / 2:  # the least half of any threshold
                    newest_late[rank].append(list(newest))
            if len(block.matches) >= STRAGGLER_MIN_SAMPLES:
                sampled_runs[rank] += 1
                marked = [x for x in late if x >= STRAGGLER_MIN_MS / 2]
                if marked and _often_enough(len(marked), len(late)):
                    late_in_runs[rank].append((len(late), len(block.ranks), marked))
        sampled_in[block.matches[0].group_id].update(block.ranks)
        if len(block.ranks) > 2:
            in_wide_group.update(block.ranks)
    return Samples(samples_of, dict(Counter(chain.from_iterable(sampled_in.values()))), in_wide_group,
                   dict(long_runs), dict(newest_late), dict(sampled_runs), dict(late_in_runs))


def _typical_lateness(samples: Samples) -> tuple[dict[int, float], dict[int, array[float]]]:
    """(rank -> typical lateness in ms, rank -> all its samples), over every group the
    rank is in. A straggler is late to every collective; a rank that merely waited for it
    is late only where it then meets others, so the median over all of a rank's
    collectives keeps such victims out."""
    typical, kept = {}, {}
    for rank, values in samples.of_rank.items():
        # One two-member group alone cannot say which of its two ranks is late.
        confirmed = samples.groups_of.get(rank, 0) >= 2 or rank in samples.in_wide_group
        if len(values) >= STRAGGLER_MIN_SAMPLES and confirmed:
            typical[rank] = statistics.median(values)
            kept[rank] = values
    return typical, kept
