"""Rebuild the job's process groups from the dumps.

Takes the loaded `RankDump`s; returns a `Layout`: world size, ranks found and
missing, `Group`s and `Membership`s, and a way to route each rank's entries to its
group. Groups are identified by name (the rank-local `pg_id` means different groups
on different ranks). Membership comes from `pg_config` when it lists ranks; gloo
dumps leave it empty, so it is then rebuilt from which ranks carry entries of the
group, the default group spans the world, and ranks without a dump are placed into
the sibling group that is one member short.

Rank numbers are data like any other: one that no plausible job could have (a corrupt
file name, a stray digit in a `pg_config` string) is set aside with a note instead of
sizing the world, so ten billion phantom ranks are never materialised.
"""

from __future__ import annotations

import operator
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

from frtrace.model import UNDESCRIBED, Group, LoadIssue, Membership, PgConfig
from frtrace.table.entry_table import EntryTable
from frtrace.table.rank_dump import RankDump
from frtrace.util import plural

DEFAULT_GROUP_NAME = "0"
DEFAULT_GROUP_DESC = "default_pg"
# The world is sized from the largest rank named anywhere, and missing ranks and the
# default group are then listed one by one, so a rank number must have data behind it.
# The dumps vouch for as many ranks as there are dump files, or as the largest group a
# pg_config lists (NCCL lists the whole world in the default group's). A rank beyond
# PLAUSIBLE_WORLD_FACTOR times that, and beyond PLAUSIBLE_WORLD_FLOOR, would mean more
# than 15 in 16 ranks left no trace: it is far likelier a corrupt number. The floor keeps
# a few gloo dumps (no rank lists) copied from a mid-sized job usable; --world-size
# raises the limit for a job that really is that sparse.
PLAUSIBLE_WORLD_FLOOR = 1024
PLAUSIBLE_WORLD_FACTOR = 16
# What --world-size may claim: ten times the largest jobs frtrace is meant for, still
# cheap to list rank by rank.
MAX_WORLD_SIZE = 1 << 20
# Global ranks, sorted (a group's members, a pg_config's list).
Ranks = tuple[int, ...]


@dataclass(slots=True)
class Layout:
    world_size: int
    ranks_found: Ranks
    ranks_missing: Ranks  # members of the world without a usable dump
    groups: tuple[Group, ...]  # ordered by id
    memberships: tuple[Membership, ...]
    # pg_name -> group ids carrying that name (several only when rank sets differ)
    ids_by_name: dict[str, list[int]]
    # Dumps set aside because the rank in their file name is implausible: they are
    # reported like unreadable files and belong to no group.
    ignored_files: tuple[LoadIssue, ...] = ()
    ignored_ranks: frozenset[int] = frozenset()
    warnings: tuple[tuple[int, str], ...] = ()  # (rank, note) about rank numbers in its pg_config that were not believed
    # What sized the world: "pg_config" (a rank list the dumps give), "option" (--world-size),
    # "group_shapes" (sibling groups one member short: see _ranks_beyond_files) or "files" (the
    # highest rank in a file name: gloo's pg_config lists no ranks, so a top rank that left no
    # dump would not show).
    world_source: str = "pg_config"

    def group_of(self, pg_name: str, rank: int) -> Optional[int]:
        if rank in self.ignored_ranks:
            return None
        ids = self.ids_by_name.get(pg_name)
        if not ids:
            return None
        if len(ids) == 1:
            return ids[0]
        for gid in ids:
            if rank in self.groups[gid].ranks:
                return gid
        return ids[0]

    def usable(self, dumps: Iterable[RankDump]) -> list[RankDump]:
        """The dumps that take part in the analysis (not set aside for their rank)."""
        return [d for d in dumps if d.rank not in self.ignored_ranks]


_GROUP_OF_ENTRY = operator.attrgetter("pg_name", "pg_desc")


@dataclass(slots=True)
class _GroupFacts:
    descs: Counter[str]
    users: set[int]  # ranks that carry entries of the group
    configured: dict[int, Ranks]  # rank -> ranks tuple from that rank's own pg_config


@dataclass(slots=True)
class _Draft:
    """A group before missing ranks are placed (see _draft_groups)."""

    name: str
    desc: str
    ranks: Ranks
    source: str  # what Group.membership_source will say


def _groups_of_entries(entries: EntryTable) -> set[tuple[str, str]]:
    """The (pg_name, pg_desc) pairs `entries` hold."""
    return {(static.pg_name, static.pg_desc) for static in entries.statics_in_use()}


def _collect_facts(dumps: Iterable[RankDump], configs: dict[int, tuple[PgConfig, ...]]) -> dict[str, _GroupFacts]:
    """Per group name: descriptions, users and configured rank sets (`configs`: rank ->
    that rank's pg_config, already cleared of implausible ranks)."""
    facts: dict[str, _GroupFacts] = defaultdict(lambda: _GroupFacts(Counter(), set(), {}))
    for dump in dumps:
        for pg_name, pg_desc in _groups_of_entries(dump.entries):
            fact = facts[pg_name]
            fact.users.add(dump.rank)
            fact.descs[pg_desc] += 1
        for config in configs[dump.rank]:
            # gloo writes one group named '' whose ranks are meaningless for the entries
            if config.name == "" and "" not in facts:
                continue
            fact = facts[config.name]
            if config.desc:
                fact.descs[config.desc] += 1
            if config.ranks:
                fact.configured[dump.rank] = config.ranks
    return facts


def corroborated_rank_lists(dumps: list[RankDump]) -> list[Ranks]:
    """The pg_config rank lists that can size the world: those at least two dumps list
    (NCCL ranks all list the default group's, the whole world), or every list when there
    is only one dump. A rank count that one dump claims and no other dump, no file and
    no --world-size backs is not believed: a 224 KB file listing 100,000 ranks would
    otherwise turn a healthy 2-rank job into a report on 99,998 missing ranks."""
    witnesses: dict[int, tuple[Ranks, set[int]]] = {}  # id(ranks) -> (ranks, dumps listing them); the loader shares equal lists
    for dump in dumps:
        for config in dump.pg_config:
            if config.ranks:
                witnesses.setdefault(id(config.ranks), (config.ranks, set()))[1].add(dump.rank)
    by_value: dict[Ranks, set[int]] = defaultdict(set)  # equal lists the loader did not share (few)
    for ranks, listed_by in witnesses.values():
        by_value[ranks] |= listed_by
    if len(dumps) < 2:  # a lone dump: nothing to corroborate it, nothing to contradict it
        return list(by_value)
    return [ranks for ranks, listed_by in by_value.items() if len(listed_by) >= 2]


def plausible_rank_limit(dumps: list[RankDump], failed_ranks: Iterable[int], hint: Optional[int],
                         corroborated: Optional[list[Ranks]] = None) -> int:
    """Ranks at or above this number have no data behind them (see PLAUSIBLE_WORLD_FACTOR)."""
    vouched = len({d.rank for d in dumps} | set(failed_ranks))
    lists = corroborated_rank_lists(dumps) if corroborated is None else corroborated
    vouched = max([vouched] + list(map(len, lists)))
    return max(hint or 0, PLAUSIBLE_WORLD_FLOOR, PLAUSIBLE_WORLD_FACTOR * vouched)


class _Evidence(NamedTuple):
    """What a rank number in a pg_config needs behind it: below `limit` (plausible), and
    below `extent` (a file or --world-size reaches it) or in a corroborated list."""

    limit: int
    extent: int
    corroborated: frozenset[int]


def _believable_configs(dumps: list[RankDump],
                        evidence: _Evidence) -> tuple[dict[int, tuple[PgConfig, ...]], list[tuple[int, str]]]:
    """Each dump's pg_config without ranks lacking evidence (rank -> configs), and a
    (rank, warning) per group that had some."""
    configs: dict[int, tuple[PgConfig, ...]] = {}
    warnings: list[tuple[int, str]] = []
    # Every rank lists the world (one shared tuple): when top ranks left no dump, each
    # list is checked once, not once per dump (16,384 x 16,384 ranks).
    checked: dict[tuple[int, str, str], tuple[PgConfig, str]] = {}  # (id(ranks), name, desc) -> (config, note)
    for dump in dumps:
        kept = []
        for config in dump.pg_config:
            ranks = config.ranks or ()
            if ranks and ranks[-1] >= evidence.extent:  # ranks are sorted
                key = (id(ranks), config.name, config.desc)
                if key not in checked:
                    checked[key] = _without_unbacked_ranks(config, evidence)
                config, note = checked[key]
                if note:
                    warnings.append((dump.rank, note))
            kept.append(config)
        configs[dump.rank] = tuple(kept)
    return configs, warnings


def _without_unbacked_ranks(config: PgConfig, evidence: _Evidence) -> tuple[PgConfig, str]:
    """`(config, warning or "")`: the config without the ranks `evidence` does not back."""
    assert config.ranks is not None  # only configs that list ranks are checked
    absurd = [r for r in config.ranks if r >= evidence.limit]
    unbacked = [r for r in config.ranks if evidence.extent <= r < evidence.limit and r not in evidence.corroborated]
    if not absurd and not unbacked:
        return config, ""
    dropped = set(absurd) | set(unbacked)
    kept = PgConfig(config.name, config.desc, tuple(r for r in config.ranks if r not in dropped) or None)
    if unbacked:
        return kept, (f"pg_config of group {config.name!r} lists {len(dropped):,} rank(s) ({_first_few(sorted(dropped))}) "
                      f"that no other dump lists and no dump file is named after "
                      f"(pass --world-size if the job had them): ignored")
    return kept, (f"pg_config of group {config.name!r} lists implausible rank(s) {_first_few(absurd)} "
                  f"(limit {evidence.limit - 1} for these dumps; pass --world-size if the job was that large): ignored")


def _first_few(ranks: list[int]) -> str:
    return f"{', '.join(map(str, ranks[:3]))}{' ...' if len(ranks) > 3 else ''}"


def _world_size(ranks: Iterable[int], configs: dict[int, tuple[PgConfig, ...]], hint: Optional[int]) -> tuple[int, str]:
    """`(world size, what sized it)`: see Layout.world_source."""
    from_files = max(list(ranks) + [-1]) + 1
    from_configs = 0
    for dump_configs in configs.values():
        for config in dump_configs:
            if config.ranks:
                from_configs = max(from_configs, config.ranks[-1] + 1)
    world = max(from_files, from_configs, hint or 0)
    if hint and hint >= world:
        return world, "option"
    return world, "pg_config" if from_configs >= world else "files"


def is_default_group(name: str, desc: str) -> bool:
    """Whether a group is the job's default group (what init_process_group creates)."""
    return name == DEFAULT_GROUP_NAME or desc == DEFAULT_GROUP_DESC


def _draft_groups(facts: dict[str, _GroupFacts], world: int) -> list[_Draft]:
    """A draft of every group, before missing ranks are placed."""
    drafts = []
    for name, fact in facts.items():
        desc = fact.descs.most_common(1)[0][0] if fact.descs else ""
        # The loader shares equal rank lists, so most are one object: hash each object once.
        rank_sets = set({id(ranks): ranks for ranks in fact.configured.values()}.values())
        if rank_sets:
            # Same-named groups with different rank sets stay apart.
            for ranks in sorted(rank_sets):
                drafts.append(_Draft(name, desc, ranks, "pg_config"))
        elif is_default_group(name, desc):
            drafts.append(_Draft(name, desc, tuple(range(world)), "world"))
        else:
            drafts.append(_Draft(name, desc, tuple(sorted(fact.users)), "entries"))
    return drafts


def _stride(ranks: Ranks) -> Optional[int]:
    steps = {b - a for a, b in zip(ranks, ranks[1:])}
    return steps.pop() if len(steps) == 1 else None


def _place_missing_ranks(drafts: list[_Draft], missing: Ranks) -> None:
    """A rank without a dump is invisible in entry-built groups; put it back where a
    sibling group (same description) is exactly that rank short of the usual shape."""
    by_desc: dict[str, list[_Draft]] = defaultdict(list)
    for draft in drafts:
        # A listed group nobody carried entries of has no members to compare shapes
        # with, and nothing says which missing rank would belong to it.
        if draft.source == "entries" and draft.ranks:
            by_desc[draft.desc].append(draft)
    for siblings in by_desc.values():
        sizes = Counter(len(d.ranks) for d in siblings)
        usual_size, _ = sizes.most_common(1)[0]
        strides = Counter(_stride(d.ranks) for d in siblings if len(d.ranks) == usual_size)
        usual_stride = strides.most_common(1)[0][0] if strides else None
        taken = {r for d in siblings for r in d.ranks}
        for draft in siblings:
            short_by = usual_size - len(draft.ranks)
            if short_by <= 0:
                continue
            fits = [m for m in missing if m not in taken and _fits(draft.ranks, m, usual_size, usual_stride)]
            if 0 < len(fits) <= short_by:
                draft.ranks = tuple(sorted(draft.ranks + tuple(fits)))
                taken.update(fits)


def _fits(ranks: Ranks, candidate: int, usual_size: int, usual_stride: Optional[int]) -> bool:
    grown = tuple(sorted(ranks + (candidate,)))
    if usual_stride is None:
        return ranks[0] <= candidate <= ranks[-1] or len(grown) == usual_size
    offsets = {(r - grown[0]) % usual_stride for r in grown}
    return offsets == {0} and (grown[-1] - grown[0]) <= usual_stride * (usual_size - 1)


def _ranks_beyond_files(drafts: list[_Draft], world: int, absent: Ranks) -> Ranks:
    """Ranks at or above `world` that the shapes of entry-built groups call for: a family of
    sibling groups (same description, one of them at least of the usual size) that holds
    every rank with entries, where a group is short of the usual shape by exactly the
    ranks above `world` that would complete it (a 2x4 mesh whose rank 7 left no dump: tp
    [4,5,6] next to [0-3], dp [3] next to [0,4], [1,5], [2,6]). A family that misses a
    rank with entries (its buffer wrapped past the group's ops) says nothing, and neither
    does a group that one of the ranks below `world` without a usable dump (`absent`)
    would complete (the same mesh without rank 3: dp [7] is short of rank 3, not of 11)."""
    users = {r for draft in drafts if draft.source == "entries" for r in draft.ranks}
    by_desc: dict[str, list[_Draft]] = defaultdict(list)
    for draft in drafts:
        if draft.source == "entries" and draft.ranks and draft.desc not in UNDESCRIBED:
            by_desc[draft.desc].append(draft)
    beyond: set[int] = set()
    for siblings in by_desc.values():
        if len(siblings) < 2 or {r for d in siblings for r in d.ranks} != users:
            continue
        usual_size, _ = Counter(len(d.ranks) for d in siblings).most_common(1)[0]
        strides = Counter(_stride(d.ranks) for d in siblings if len(d.ranks) == usual_size)
        usual_stride = strides.most_common(1)[0][0] if strides else None
        reach = world + usual_size * (usual_stride or 1)
        for draft in siblings:
            short_by = usual_size - len(draft.ranks)
            if short_by <= 0 or any(_fits(draft.ranks, r, usual_size, usual_stride) for r in absent):
                continue
            fits = [r for r in range(world, reach) if _fits(draft.ranks, r, usual_size, usual_stride)]
            if len(fits) == short_by and fits == list(range(fits[0], fits[0] + len(fits) * (usual_stride or 1),
                                                             usual_stride or 1)):
                beyond.update(fits)
    return tuple(sorted(beyond))


def _group_sort_key(draft: _Draft) -> tuple[int, int, str, Ranks]:
    name = draft.name
    if name.isascii() and name.isdecimal():
        return (0, int(name), "", draft.ranks)
    # `3/all_reduce`: an op type of group 3 lined up on its own (CUPTI monitor dumps) sorts with group 3.
    base, slash, op = name.partition("/")
    if slash and base.isascii() and base.isdecimal():
        return (0, int(base), op, draft.ranks)
    return (1, 0, name, draft.ranks)


def _implausible_files(dumps: list[RankDump], limit: int) -> list[LoadIssue]:
    """A LoadIssue per dump whose file-name rank is at or above `limit`."""
    return [
        LoadIssue(d.path, f"rank {d.rank} in the file name is implausible for {plural(len(dumps), 'dump file')} "
                          f"(limit {limit - 1}; pass --world-size if the job was that large): ignored")
        for d in dumps if d.rank >= limit
    ]


def build_layout(dumps: list[RankDump], failed_ranks: Iterable[int] = (), world_size: Optional[int] = None) -> Layout:
    """Groups, memberships and world of the job behind `dumps`."""
    failed_ranks = tuple(failed_ranks)
    corroborated = corroborated_rank_lists(dumps)
    limit = plausible_rank_limit(dumps, failed_ranks, world_size, corroborated)
    ignored_files = _implausible_files(dumps, limit)
    ignored_ranks = frozenset(d.rank for d in dumps if d.rank >= limit)
    dumps = [d for d in dumps if d.rank < limit]
    # An unreadable file with an implausible rank is already reported by the loader.
    failed_ranks = tuple(r for r in failed_ranks if r < limit)
    extent = max([d.rank + 1 for d in dumps] + [r + 1 for r in failed_ranks] + [world_size or 0])
    evidence = _Evidence(limit, extent, frozenset(r for ranks in corroborated if ranks[-1] >= extent for r in ranks))
    configs, warnings = _believable_configs(dumps, evidence)
    world, world_source = _world_size([d.rank for d in dumps] + list(failed_ranks), configs, world_size)
    found = tuple(sorted(d.rank for d in dumps))
    found_set = set(found)
    drafts = _draft_groups(_collect_facts(dumps, configs), world)
    if world_source == "files":
        dumped = {d.rank for d in dumps}
        beyond = _ranks_beyond_files(drafts, world, tuple(r for r in range(world) if r not in dumped))
        if beyond:
            world, world_source = beyond[-1] + 1, "group_shapes"
            for draft in drafts:
                if draft.source == "world":
                    draft.ranks = tuple(range(world))
    missing = tuple(r for r in range(world) if r not in found_set)
    if missing:
        _place_missing_ranks(drafts, missing)
    drafts.sort(key=_group_sort_key)
    groups: list[Group] = []
    memberships: list[Membership] = []
    ids_by_name: dict[str, list[int]] = defaultdict(list)
    for gid, draft in enumerate(drafts):
        groups.append(Group(gid, draft.name, draft.desc, draft.ranks, len(draft.ranks), draft.source))
        memberships.extend(Membership(gid, rank, local) for local, rank in enumerate(draft.ranks))
        ids_by_name[draft.name].append(gid)
    return Layout(world, found, missing, tuple(groups), tuple(memberships), dict(ids_by_name),
                  tuple(ignored_files), ignored_ranks, tuple(warnings), world_source)
