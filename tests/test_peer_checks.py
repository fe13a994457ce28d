"""The checks PyTorch's own analyzer makes beyond order and op names (issue 29), each on a
faulty job and a healthy twin that must stay healthy: P2P pair sizes and dtypes, an
all_to_all's exchange as a whole, entries that contradict their own op and group size,
and entries whose fields come in other shapes (compared as far as they can be read;
never "agreed" where nothing could be). Every case asserts status, suspects, the rule
and the exit code of the CLI."""

import pytest
from helpers import analyse_dicts, dump, entry, job, run_cli, write_job

AR = "all_reduce"
RUNNING = {"state": "started"}
QUEUED = {"state": "scheduled"}


def _verdict(dumps: dict, tmp_path) -> tuple:
    """(diagnosis, the CLI's exit code) of a job."""
    _, diagnosis = analyse_dicts(dumps)
    result = run_cli([write_job(tmp_path / "job", dumps), "--workers", "1"])
    return diagnosis, result.exit_code


def _rules(diagnosis) -> set:
    return {f.rule for f in diagnosis.findings}


def _only(diagnosis, rule: str):
    (finding,) = [f for f in diagnosis.findings if f.rule == rule]
    return finding


# --------------------------------------------------------------------------- fields in other shapes


def _torch_style(ops: list, **odd) -> dict:
    """Two ranks' entries as torch's analyzer tests write them: dtypes as one bare name,
    sequence numbers as strings, no pg_id or op_id."""
    dumps = {}
    for rank, (op, ins, outs) in enumerate(ops):
        record = {"record_id": 0, "profiling_name": f"nccl:{op}", "state": "completed", "process_group": ("0", "default"),
                  "input_sizes": ins, "output_sizes": outs, "input_dtypes": "float32", "output_dtypes": "float32",
                  "collective_seq_id": "1", "p2p_seq_id": "0", "time_created_ns": 0, "frames": [], "is_p2p": False}
        record.update(odd)
        dumps[rank] = {"entries": [record], "version": "2.8",
                       "pg_config": {"0": {"name": "0", "desc": "default", "ranks": "[0, 1]"}}}
    return dumps


def test_bare_dtype_names_and_string_numbers_are_read_and_compared(tmp_path):
    diagnosis, code = _verdict(_torch_style([("all_reduce", [[4, 4]], [[4, 4]]), ("all_gather", [[4, 4]], [[8, 4]])]),
                               tmp_path)
    finding = _only(diagnosis, "divergence.mismatch_tie")
    assert (finding.kind, finding.suspect_ranks) == ("op_mismatch", (0, 1))
    assert "float32" in finding.message
    assert (diagnosis.status, code) == ("faults", 1)
    assert not any(d.warnings for d in analyse_dicts(_torch_style([("all_reduce", [[4]], [[4]])] * 2))[0].dumps)


def test_bare_dtype_names_that_agree_stay_healthy(tmp_path):
    diagnosis, code = _verdict(_torch_style([("all_reduce", [[4, 4]], [[4, 4]])] * 2), tmp_path)
    assert (diagnosis.status, diagnosis.findings, code) == ("healthy", [], 0)


def test_unreadable_sizes_still_compare_the_op_names(tmp_path):
    dumps = _torch_style([("all_reduce", [[4, 4]], [[4, 4]]), ("all_gather", [[4, 4]], [[8, 4]])],
                         input_sizes={"not": "shapes"}, input_dtypes=7)
    diagnosis, code = _verdict(dumps, tmp_path)
    assert _only(diagnosis, "divergence.mismatch_tie").kind == "op_mismatch"
    assert (diagnosis.status, code) == ("faults", 1)


def test_unreadable_sizes_of_agreeing_ops_are_a_note_not_a_verdict(tmp_path):
    dumps = _torch_style([("all_reduce", [[4, 4]], [[4, 4]])] * 2, input_sizes={"not": "shapes"})
    diagnosis, code = _verdict(dumps, tmp_path)
    note = _only(diagnosis, "unchecked.unreadable_entries")
    assert (note.kind, note.severity, note.ranks) == ("not_compared", "info", (0, 1))
    assert "input_sizes" in note.message
    assert (diagnosis.status, code) == ("healthy", 0)


def test_ops_that_could_not_be_read_are_never_agreed(tmp_path):
    diagnosis, code = _verdict(_torch_style([("all_reduce", [[4]], [[4]])] * 2, profiling_name=5), tmp_path)
    finding = _only(diagnosis, "unchecked.unreadable_entries")
    assert (finding.kind, finding.severity, finding.suspect_ranks) == ("not_compared", "warning", ())
    assert "could not be checked" in finding.message and "not agreed" in finding.message
    assert (diagnosis.status, code) == ("inconclusive", 3)
