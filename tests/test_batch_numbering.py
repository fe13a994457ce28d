"""torch builds whose `startCoalescing` bumps the collective counter number each P2P batch
as a collective of its own. A pipeline's stages post different numbers of batches, so by
those numbers one collective of the pipeline group is a different number on each stage:
frtrace counts such groups' collectives apart from their batches (collective number less
P2P number, `normalise.count_collectives_apart_from_batches`), as other builds number them,
and reads the job as it reads the same job numbered the other way."""

from __future__ import annotations

import pytest
from helpers import analyse_dicts

from frtrace.load.normalise import normalise_dump
from frtrace.table.batches import batch_numbering
from frtrace.testing.inject import batches_numbered_as_collectives
from frtrace.testing.synth import Fault, generate


def _interleaved(fault: Fault, seed: int) -> dict:
    """An interleaved pipeline (TP 2 x PP 4 x DP 2, two model chunks per stage), every P2P op
    batched; its pipeline groups also run a collective per step."""
    job = generate(16, 2, 4, steps=4, timing=True, seed=seed, p2p="batched", coalesced_events="marker", vchunks=2,
                   fault=fault)
    assert job.truth["suspect_ranks"] == [fault.rank]
    return dict(job.dumps)


@pytest.mark.parametrize("fault, seed", [(Fault("hang", rank=5, group="pp"), 1),
                                         (Fault("hang", rank=9, group="pp"), 2),
                                         (Fault("op_mismatch", rank=4, group="pp"), 8),
                                         (Fault("skip_op", rank=7, group="pp"), 9)])
def test_a_pipeline_collective_is_one_number_on_every_stage_however_torch_numbers_batches(fault, seed):
    dumps = _interleaved(fault, seed)
    bumped = batches_numbered_as_collectives(dumps)
    assert any(entry["collective_seq_id"] != before["collective_seq_id"]
               for rank in dumps for entry, before in zip(bumped[rank]["entries"], dumps[rank]["entries"]))

    _, as_counted = analyse_dicts(dumps, render=False)
    _, as_bumped = analyse_dicts(bumped, render=False)

    assert (as_bumped.status, as_bumped.suspect_ranks) == (as_counted.status, as_counted.suspect_ranks) \
        == ("faults", (fault.rank,))


def test_the_numbering_is_read_off_a_batch_recorded_right_after_another():
    dumps = _interleaved(Fault("hang", rank=5, group="pp"), 1)
    bumped = batches_numbered_as_collectives(dumps)

    def says(dump: dict):
        return batch_numbering(normalise_dump(dump, 0, "rank_0", "pickle").entries)

    assert says(bumped[0]) is True and says(dumps[0]) is False
    # A rank whose batches never follow one another says nothing.
    assert {says(dumps[rank]) for rank in dumps} == {False, None}


def test_a_job_one_rank_of_which_numbers_batches_apart_is_left_as_it_is():
    # The torch build is the job's: a rank that shows batches without numbers of their own
    # keeps every rank's numbers as they are (nothing says which numbering is right).
    dumps = _interleaved(Fault("hang", rank=5, group="pp"), 1)
    mixed = {**batches_numbered_as_collectives(dumps), 0: dumps[0]}

    analysis, _ = analyse_dicts(mixed, render=False)

    renumbered = [dump for dump in analysis.dumps if dump.rank != 0
                  and dump.entries.field("collective_seq_id") != _raw_numbers(mixed[dump.rank])]
    assert not renumbered


def _raw_numbers(dump: dict) -> list:
    return [entry["collective_seq_id"] for entry in dump["entries"]]
