"""Groups made without a description ("undefined", as `new_group` leaves them) still form
families: the TP groups, the DP groups and the PP groups of a mesh hold their ranks spaced
alike (consecutive, every TP-th, every TP x DP-th), so the like ranks of another group can
say whether a rank skipped an op. Without that, a job whose groups have no description
blamed the wrong rank where its described twin named the culprit."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.model import Group, family_of
from frtrace.testing.synth import Fault, generate

FAITHFUL = {"coalesced_events": "marker", "watchdog_ms": 100.0, "bubble_ms": 100.0, "pg_status": "work"}


def _undescribed(job) -> dict:
    """The job's dumps with every group described as "undefined"."""
    dumps = {}
    for rank, dump in job.dumps.items():
        dumps[rank] = dict(
            dump,
            entries=[dict(e, process_group=[e["process_group"][0], "undefined"]) for e in dump["entries"]],
            pg_config={name: dict(config, desc="undefined") for name, config in dump["pg_config"].items()})
    return dumps


@pytest.mark.parametrize("layout, kind, group, culprit", [
    ((16, 2, 2), "skip_op", "tp", 4), ((32, 2, 4), "skip_op", "tp", 7), ((32, 2, 8), "skip_op", "tp", 4),
    ((16, 2, 2), "p2p_unmatched", "pp", 4), ((32, 2, 8), "p2p_unmatched", "pp", 7),
])
def test_a_job_whose_groups_have_no_description_names_the_culprit(layout, kind, group, culprit):
    job = generate(*layout, steps=3, fault=Fault(kind, rank=culprit, group=group, step=1), timing=True, p2p="mixed",
                   seed=culprit % 3, **FAITHFUL)
    truth = (job.truth["status"], tuple(job.truth["suspect_ranks"]))
    _, described = analyse_dicts(dict(job.dumps), render=False)
    _, undescribed = analyse_dicts(_undescribed(job), render=False)
    assert (described.status, described.suspect_ranks) == truth
    assert (undescribed.status, undescribed.suspect_ranks) == truth


def test_a_mesh_s_undescribed_groups_of_one_size_fall_in_one_family_per_dimension():
    tp = [Group(1, "1", "undefined", (0, 1), 2, "pg_config"), Group(2, "2", "undefined", (2, 3), 2, "pg_config")]
    pp = [Group(3, "3", "undefined", (0, 8), 2, "pg_config"), Group(4, "4", "", (1, 9), 2, "pg_config")]
    assert family_of(tp[0]) == family_of(tp[1]) != family_of(pp[0]) == family_of(pp[1])
    described = Group(5, "5", "mesh_tp", (4, 5), 2, "pg_config")
    assert family_of(described) == ("mesh_tp", 2) != family_of(tp[0])
