"""The text report fits one screen at any job size (issue 25): the verdict, every root
finding, consequences folded one line per class of groups, where each rank is; lines
fit the width (100 columns when piped), wrapping. And the call site is the user's."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from helpers import analyse_dicts, run_cli, write_synth_job

from frtrace.model import Frame
from frtrace.report.render import SCREEN_LINES, render_text
from frtrace.report.text_layout import MIN_WIDTH, table_lines, wrap_line
from frtrace.testing.synth import Fault, generate
from frtrace.wording import FRAMEWORK, INSTALLED, STANDARD_LIBRARY, USER, call_frame, frame_origin


@pytest.fixture(scope="module")
def cascade():
    """256 ranks (TP 8 x PP 4 x DP 8): rank 5 never joins a TP all_reduce, and every PP and
    DP group it holds up reports a consequence."""
    synth = generate(256, tp=8, pp=4, steps=4, timing=True, fault=Fault("hang", rank=5, group="tp", step=3))
    return analyse_dicts(dict(synth.dumps), render=False)


def _consequences(diagnosis):
    return [f for f in diagnosis.findings if not f.is_root]


def test_the_report_leads_with_the_verdict_then_roots_then_folded_consequences_then_ranks(cascade):
    analysis, diagnosis = cascade
    assert len(_consequences(diagnosis)) > 20  # the shape this is about: many groups held up
    lines = render_text(analysis, diagnosis).splitlines()
    assert lines[0] == diagnosis.verdict and lines[1].startswith("Suspect ranks: 5 (confidence ")
    order = [next(i for i, line in enumerate(lines) if line.startswith(start))
             for start in ("Group 1 (tp)", "Consequences of the root cause:", "Where each rank is", "Read 256 dumps")]
    assert order == sorted(order)
    text = "\n".join(lines)
    # roots in full; no consequence listed one by one
    assert all(f.is_root for f in diagnosis.findings if f.message[:60] in text.replace("\n    ", " "))
    assert "consequence]" not in text
    assert len(lines) <= SCREEN_LINES


def test_consequences_fold_into_one_line_per_class_of_groups_with_their_counts(cascade):
    analysis, diagnosis = cascade
    lines = render_text(analysis, diagnosis, width=None).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Consequences of the root cause:"))
    heading, folded = lines[start], []
    for line in lines[start + 1:]:
        if not line.startswith("  - "):
            break
        folded.append(line)
    consequences = _consequences(diagnosis)
    assert f"{len(consequences)} findings in {len({f.group_id for f in consequences})} other groups" in heading
    want = Counter((f.pg_desc, f.kind) for f in consequences)
    assert len(folded) == len({desc for desc, _ in want})  # one line per class (pp, dp)
    for line in folded:
        desc = re.match(r"  - groups [\d,-]+ \((\w+)\):", line).group(1)
        for count, kind in re.findall(r"(\d+) (\w+)(?:,| at)", line):
            assert want.pop((desc, kind)) == int(count)
    assert not want


def test_everything_with_all_or_verbose(cascade):
    analysis, diagnosis = cascade
    every = render_text(analysis, diagnosis, show_all=True)
    verbose = render_text(analysis, diagnosis, verbose=True)
    for text in (every, verbose):
        assert text.count("consequence]") == len(_consequences(diagnosis))
        assert "Consequences of the root cause:" not in text
    assert "rule: divergence.never_issued" in verbose and "rule:" not in every


@pytest.mark.parametrize("width", [MIN_WIDTH, 60, 80, 100, 132])
def test_every_line_fits_the_width(cascade, width):
    analysis, diagnosis = cascade
    for show_all in (False, True):
        text = render_text(analysis, diagnosis, width=width, show_all=show_all)
        assert max(map(len, text.splitlines())) <= width


def test_the_cli_lays_out_100_columns_when_piped_and_all_lists_everything(tmp_path):
    synth = generate(64, tp=4, pp=2, steps=3, timing=True, fault=Fault("hang", rank=5, group="tp", step=2))
    directory = write_synth_job(tmp_path / "dumps", synth)
    default, every = run_cli([directory]), run_cli([directory, "--all"])
    assert default.exit_code == every.exit_code == 1
    assert max(map(len, default.stdout.splitlines())) <= 100
    assert "Consequences of the root cause:" in default.stdout and "consequence]" not in default.stdout
    assert "consequence]" in every.stdout and len(every.stdout.splitlines()) > len(default.stdout.splitlines())
    assert every.stdout.splitlines()[0] == default.stdout.splitlines()[0]


def test_a_wrapped_line_keeps_its_words_and_indents_under_its_bullet():
    line = "  - [error: not_issued] rank 5 never issued all_reduce #6; ranks 0-4,6-7,9,11,13,15,17,19 are waiting in it"
    wrapped = wrap_line(line, 40)
    assert all(len(piece) <= 40 for piece in wrapped)
    assert all(piece.startswith("    ") for piece in wrapped[1:])
    assert " ".join(piece.strip() for piece in wrapped).replace(", ", ",") == line.strip()
    # rank lists break after a comma, never inside a range
    assert not any(re.search(r"\d-$", piece) for piece in wrapped)


@pytest.mark.parametrize("width", [40, 64, 100])
def test_a_table_wraps_its_cells_or_becomes_blocks_and_fits(width):
    headers = ("ranks", "count", "blocked in", "state", "since", "last completed", "behind its peers")
    rows = [("0,2-7", "7", "all_reduce #6 in group 1 (tp)", "scheduled", "53-55 ms", "all_reduce #3 in group 0 (default_pg)",
             "1 collective in groups 193,195-200 (dp); 1 collective in group 1 (tp)"),
            ("1 *", "1", "nothing: every op it holds completed", "", "", "all_reduce #3 in group 0 (default_pg)", "")]
    lines = table_lines(headers, rows, width)
    assert max(map(len, lines)) <= width
    text = " ".join(lines)
    for cell in ("53-55 ms", "scheduled", "0,2-7"):
        assert cell in text
    wide = table_lines(headers, rows, 300)
    assert len(wide) == 4 and wide[0].split() == "ranks count blocked in state since last completed behind its peers".split()


# --------------------------------------------------------------------------- the user's call site

TORCH = "/opt/conda/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
CONTEXTLIB = "/opt/conda/lib/python3.11/contextlib.py"


def test_frames_are_told_apart_by_their_path():
    assert frame_origin(Frame("all_reduce", TORCH, 1)) == FRAMEWORK
    assert frame_origin(Frame("__exit__", CONTEXTLIB, 144)) == STANDARD_LIBRARY
    assert frame_origin(Frame("wrapper", "C:\\Python311\\Lib\\functools.py", 9)) == STANDARD_LIBRARY
    assert frame_origin(Frame("fit", "/usr/lib/python3/dist-packages/lightning/trainer.py", 9)) == INSTALLED
    assert frame_origin(Frame("step", "/home/me/library/train.py", 9)) == USER


def test_the_call_site_is_the_users_frame_then_an_installed_package_then_the_standard_library():
    torch, stdlib = Frame("all_reduce", TORCH, 1), Frame("__exit__", CONTEXTLIB, 144)
    package = Frame("fit", "/venv/lib/python3.11/site-packages/lightning/trainer.py", 9)
    user = Frame("step", "/workspace/train.py", 12)
    assert call_frame((torch, stdlib, package, user)) == (user, (torch, stdlib, package))
    assert call_frame((torch, stdlib, package)) == (package, (torch, stdlib))
    assert call_frame((torch, stdlib)) == (stdlib, (torch,))
    assert call_frame((torch,)) == (torch, ())


def test_a_generated_job_with_standard_library_frames_names_the_users_call_site(tmp_path):
    # A DP group's coalesced gradient reduction ends in contextlib's __exit__ (torch's
    # _coalescing_manager), above the user's reduce_grads: rank 5 never joins the next op.
    synth = generate(32, tp=4, pp=2, steps=4, fault=Fault("hang", rank=5, group="dp", step=1))
    analysis, diagnosis = analyse_dicts(dict(synth.dumps), render=False)
    root = diagnosis.findings[0]
    assert root.is_root and diagnosis.suspect_ranks == (5,)
    assert root.evidence["suspect_call_site"] == "/workspace/job/optimizer.py:136 in reduce_grads"
    directory = write_synth_job(tmp_path / "dumps", synth)
    quiet, verbose = run_cli([directory]), run_cli([directory, "-v"])
    assert "contextlib" not in quiet.stdout
    assert "suspect call site: /workspace/job/optimizer.py:136 in reduce_grads" in quiet.stdout
    skipped = verbose.stdout[verbose.stdout.index("suspect call site:"):].replace("\n", " ")
    assert re.search(r"frames skipped above it: distributed_c10d.py:\d+ in _coalescing_manager \(torch\),\s+"
                     r"contextlib.py:144 in __exit__ \(standard library\)", skipped)


def test_columns_sets_the_width_of_piped_output(tmp_path):
    synth = generate(16, tp=4, pp=2, steps=3, timing=True, fault=Fault("hang", rank=5, group="tp", step=2))
    directory = write_synth_job(tmp_path / "dumps", synth)
    narrow = run_cli([directory], env={"COLUMNS": "60"}).stdout.splitlines()
    assert max(map(len, narrow)) <= 60 < max(map(len, run_cli([directory]).stdout.splitlines()))


@pytest.mark.parametrize("case", ["hang_never_arrives", "hang_never_arrives_json", "p2p_unmatched_recv",
                                  "p2p_unmatched_recv_json"])
def test_a_gloo_op_never_issued_says_of_its_peers_what_the_rank_table_says(case):
    # gloo retires an op that timed out: a peer holding the op retired is listed as blocked
    # in nothing, and the finding may not say it is waiting in the op.
    from helpers import fixture_dir

    from frtrace.wording import ranks_text

    result = run_cli(["-d", fixture_dir(case), "--format", "json"])
    report = json.loads(result.output)
    (finding,) = [f for f in report["findings"] if f["rule"] == "divergence.never_issued"]
    peers = [row for row in report["ranks"] if not row["suspect"]]
    blocked = sorted(r for row in peers if row["blocked_in"] for r in row["rank_list"])
    retired = sorted(r for row in peers if not row["blocked_in"] for r in row["rank_list"])
    assert retired, "the fixture should hold a peer that retired the op"
    if blocked:
        said = f"{ranks_text(blocked)} {'is' if len(blocked) == 1 else 'are'} waiting in it and {ranks_text(retired)} retired it"
    else:
        said = f"{ranks_text(retired)} issued it and retired it"
    assert said in finding["message"]
    assert "waiting in it" not in finding["message"].replace(said, "")
