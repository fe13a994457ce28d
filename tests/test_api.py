"""The Python API: `frtrace.analyze` / `diagnose` / `diff`, without side effects.

Called twice in one process with a str, a Path and a list; from a fresh interpreter; its
reports are the command's, byte for byte; errors are exceptions, never exits or prints.
"""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import nccl_hang_dumps, write_job

import frtrace
from frtrace.cli.analyse import frtrace as command


@pytest.fixture
def hang(tmp_path) -> Path:
    """Ranks 0-2 wait in all_reduce #4, which rank 3 never issued."""
    return write_job(tmp_path / "dumps", nccl_hang_dumps(world=4, culprit=3))


def _facts(diagnosis) -> tuple:
    return diagnosis.status, tuple(diagnosis.suspect_ranks), diagnosis.exit_code, diagnosis.verdict


def test_a_str_a_path_and_a_list_give_the_same_diagnosis_called_twice(hang, monkeypatch):
    monkeypatch.chdir(hang.parent)
    answers = []
    for _ in range(2):  # twice in one process: nothing left over from the first round
        for inputs in ("dumps", hang, [hang], ["dumps"], (str(hang),)):
            answers.append(_facts(frtrace.diagnose(frtrace.analyze(inputs, workers=1))))
    assert answers[0][:3] == ("faults", (3,), 1)
    assert answers[0][3].startswith("FAULT: rank 3 never issued all_reduce #4")
    assert set(answers) == {answers[0]}


def test_a_directory_string_is_one_path_never_its_characters(tmp_path, monkeypatch):
    # "d" and "u" ... would each be "no such file" if the string were iterated.
    write_job(tmp_path / "dumps", nccl_hang_dumps(world=2, culprit=1))
    monkeypatch.chdir(tmp_path)
    analysis = frtrace.analyze("dumps", workers=1)
    assert analysis.ranks_found == (0, 1) and analysis.world_size == 2


def test_the_reports_are_the_commands_byte_for_byte(hang):
    diagnosis = frtrace.diagnose(frtrace.analyze(str(hang), workers=1))
    for fmt, text in (("text", diagnosis.to_text()), ("json", diagnosis.to_json()),
                      ("markdown", diagnosis.to_markdown())):
        assert CliRunner().invoke(command, [str(hang), "--format", fmt, "--workers", "1"]).stdout == text
    assert CliRunner().invoke(command, [str(hang), "--ranks"]).stdout == diagnosis.ranks()
    assert diagnosis.to_dict() == json.loads(diagnosis.to_json())
    assert diagnosis.to_dict()["suspect_ranks"] == [3]
    assert "\x1b[" in diagnosis.to_text(color=True) and "\x1b[" not in diagnosis.to_text()


def test_errors_are_exceptions_and_nothing_is_printed_or_exited(tmp_path, capfd):
    (tmp_path / "empty").mkdir()
    with pytest.raises(frtrace.InputError, match="no such directory or file"):
        frtrace.analyze(tmp_path / "nowhere")
    with pytest.raises(frtrace.FrtraceError, match="no Flight Recorder dump files found"):
        frtrace.analyze(str(tmp_path / "empty"), workers=1)
    with pytest.raises(frtrace.InputError, match="no input given"):
        frtrace.analyze([])
    with pytest.raises(frtrace.InputError, match="max_file_size"):
        frtrace.analyze(tmp_path, max_file_size="lots")
    with pytest.raises(frtrace.InputError, match="world_size must be a number of ranks"):
        frtrace.analyze(tmp_path, world_size=0)
    with pytest.raises(TypeError):
        frtrace.analyze(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        frtrace.diagnose("dumps")  # type: ignore[arg-type]
    assert capfd.readouterr() == ("", "")


def test_no_global_state_is_changed(hang, capfd):
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)}
    collecting = gc.isenabled()
    frtrace.diagnose(frtrace.analyze(hang, workers=2)).to_text()
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers
    assert gc.isenabled() == collecting
    assert capfd.readouterr() == ("", "")


def test_diff_of_two_dump_sets(tmp_path):
    old = write_job(tmp_path / "old", nccl_hang_dumps(world=4, culprit=3))
    new = write_job(tmp_path / "new", nccl_hang_dumps(world=4, culprit=3))
    result = frtrace.diff(old, str(new), workers=1)
    assert result.status == "faults" and result.exit_code == 1
    assert result.verdict.startswith("STUCK: rank 3 made no progress")
    assert result.to_dict()["stuck_ranks"] == [0, 1, 2] and result.to_dict() == json.loads(result.to_json())
    with pytest.raises(frtrace.InputError, match="OLD and NEW are the same input"):
        frtrace.diff(old, [old])
    with pytest.raises(frtrace.InputError, match="^NEW: .*no such directory or file"):
        frtrace.diff(old, tmp_path / "nowhere")


FRESH = """
import json, sys
import frtrace
analysis = frtrace.analyze(sys.argv[1], workers=1)
diagnosis = frtrace.diagnose(analysis)
sys.stdout.write(diagnosis.to_json())
try:
    frtrace.analyze(sys.argv[1] + "-nowhere")
except frtrace.FrtraceError as exc:
    sys.stderr.write(f"{type(exc).__name__}: {exc}")
"""


def test_from_a_fresh_interpreter(hang):
    done = subprocess.run([sys.executable, "-c", FRESH, str(hang)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == CliRunner().invoke(command, [str(hang), "--format", "json"]).stdout
    assert json.loads(done.stdout)["suspect_ranks"] == [3]
    assert done.stderr == f"InputError: {hang}-nowhere: no such directory or file"
