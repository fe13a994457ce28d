"""An empty dump of only active entries says how far its rank got in each group only by
its pg_status rows, keyed by the rank's own pg_ids. Where the groups' names are hashes,
neither the rank's entries nor the names place those rows; ranks whose rows have the same
keys made their groups in one order, so the id a peer tells for a group they share is
the rank's too."""

from __future__ import annotations

import hashlib

from helpers import analyse_dicts, job


def _hashed(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


TP = {0: "tp0", 1: "tp0", 2: "tp1", 3: "tp1"}
# Made in this order on every rank: the default group, the TP pairs, the model-parallel group.
LAYOUT = {"0": ("default_pg", (0, 1, 2, 3)), _hashed("tp0"): ("tp", (0, 1)), _hashed("tp1"): ("tp", (2, 3)),
          _hashed("mp"): ("mp", (0, 1, 2, 3))}


def _two_hosts_stopped(mp_first_on: tuple[int, ...] = ()) -> dict:
    """4 ranks, TP pairs [0,1] and [2,3] and a model-parallel group of all four, group
    names hashed, dumps of only active entries. Each rank runs (TP all_reduce, MP
    all_reduce) twice, then a TP all_reduce; ranks 1 and 2 then stop issuing (their hosts
    hang), so every op they issued finished and their dumps hold nothing, while ranks 0
    and 3 wait in MP all_reduce #3. A rank's pg_id for a group counts the groups it made
    before it, as torch numbers them: the default group 0, its TP pair 1, the MP group 2
    (`mp_first_on`: ranks that made the MP group before their TP pair)."""
    program = {rank: [f"all_reduce@{_hashed(name)}" for name in (TP[rank], "mp") * 2 + (TP[rank],)] for rank in range(4)}
    for rank in (0, 3):
        program[rank].append(f"all_reduce@{_hashed('mp')}")
    dumps = job(program, groups=LAYOUT)
    for rank, dump in dumps.items():
        made = ["0", _hashed(TP[rank]), _hashed("mp")][:: 1 if rank not in mp_first_on else -1]
        made = ["0"] + [name for name in made if name != "0"]
        own_id = {str(list(LAYOUT).index(name)): position for position, name in enumerate(made)}
        for e in dump["entries"]:
            e["pg_id"] = own_id[str(e["pg_id"])]
        dump["pg_status"] = {str(own_id[key]): row for key, row in dump["pg_status"].items()}
        dump["entries"] = [e for e in dump["entries"] if e["state"] != "completed"]
    return dumps


def test_empty_dumps_rows_are_placed_by_the_ids_their_alike_peers_tell():
    dumps = _two_hosts_stopped()
    assert not dumps[1]["entries"] and not dumps[2]["entries"]
    _, diagnosis = analyse_dicts(dumps, render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("faults", (1, 2))


def test_alike_peers_that_tell_a_shared_group_two_ids_place_nothing():
    # Rank 3 made the MP group before its TP pair: its id for it (1) is not rank 0's (2),
    # so which id is rank 1's is not known, and nobody is blamed on a guess.
    _, diagnosis = analyse_dicts(_two_hosts_stopped(mp_first_on=(3,)), render=False)
    assert (diagnosis.status, diagnosis.suspect_ranks) == ("inconclusive", ())
