"""click as it is meant: values after one flag parsed by click, sizes as a type, FRTRACE_*
defaults, --color / FORCE_COLOR / NO_COLOR, --quiet, completion, progress only on a
terminal, and 141 when `| head -1` leaves the report unread."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import nccl_hang_dumps, write_job

from frtrace.cli import cli

# The verdict's first line as printed to a pipe, where the report wraps at 100 columns.
HANG_FIRST_LINE = "FAULT: rank 3 never issued all_reduce #4 in group 0 (default_pg); ranks 0-2 are"


@pytest.fixture
def hang(tmp_path) -> Path:
    return write_job(tmp_path / "dumps", nccl_hang_dumps(world=4, culprit=3))


def invoke(*args, env=None):
    result = CliRunner().invoke(cli, [str(a) for a in args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


def _header(result) -> str:
    return result.stdout.splitlines()[0]


@pytest.mark.parametrize("name", ["20251120", "4711"])
def test_a_dump_directory_named_with_digits_after_selected_ranks_is_the_path(tmp_path, monkeypatch, name):
    write_job(tmp_path / name, nccl_hang_dumps(world=4, culprit=3))
    (tmp_path / "rank_0").write_text("not a dump: the current directory must not be read")
    monkeypatch.chdir(tmp_path)
    result = invoke("-j", "--selected-ranks", "0", "1", name)
    assert result.exit_code == 0, result.output
    header = _header(result)
    assert "rank 0" in header and "rank 1" in header and "rank 2" not in header
    # ... and the values still end at the next option, in either spelling.
    result = invoke("--selected_ranks", "1", "2", "-j", name)
    assert "rank 1" in _header(result) and "rank 2" in _header(result) and "rank 0" not in _header(result)


def test_pg_filters_take_several_names_and_stop_at_the_directory(hang, monkeypatch):
    monkeypatch.chdir(hang.parent)
    result = invoke("-j", "--pg-filters", "tp", "default_pg", "dumps")
    assert result.exit_code == 0 and "1 (tp)" in result.stdout and "0 (default_pg)" in result.stdout
    only_tp = invoke("-j", "--pg-filters", "tp", "dumps")
    assert "1 (tp)" in only_tp.stdout and "0 (default_pg)" not in only_tp.stdout


def test_sizes_are_parsed_by_their_type(hang):
    assert invoke(hang, "--max-file-size", "1M").exit_code == 1
    result = invoke(hang, "--max-file-size", "lots")
    assert result.exit_code == 2 and "Invalid value for '--max-file-size'" in result.stderr
    assert "takes a size such as 512M or 4G, not 'lots'" in result.stderr


def test_frtrace_environment_variables_set_option_defaults(hang):
    result = invoke(hang, env={"FRTRACE_FORMAT": "json", "FRTRACE_WORKERS": "1"})
    assert result.exit_code == 1 and result.stdout.startswith("{")
    assert invoke(hang, "--format", "text", env={"FRTRACE_FORMAT": "json"}).stdout.startswith("FAULT")
    # A format set for every run does not stop -j, which has no formats.
    assert invoke("-j", hang, env={"FRTRACE_FORMAT": "json"}).exit_code == 0
    result = invoke(hang, env={"FRTRACE_MAX_FILE_SIZE": "lots"})
    assert result.exit_code == 2 and "--max-file-size" in result.stderr


@pytest.mark.parametrize("args, env, coloured", [
    ([], {}, False),  # not a terminal
    (["--color", "always"], {}, True),
    (["--color", "always"], {"NO_COLOR": "1"}, True),  # the command line wins
    ([], {"FORCE_COLOR": "1"}, True),
    ([], {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
    (["--color", "never"], {"FORCE_COLOR": "1"}, False),
    ([], {"FRTRACE_COLOR": "always"}, True),
])
def test_colour(hang, args, env, coloured):
    env = {"NO_COLOR": None, "FORCE_COLOR": None, **env}
    result = invoke(hang, *args, env=env)
    assert result.exit_code == 1 and ("\x1b[" in result.stdout) == coloured
    assert result.stdout.replace("\x1b[31m\x1b[1m", "").startswith(HANG_FIRST_LINE)


def test_diff_takes_the_same_colour_option(tmp_path):
    old = write_job(tmp_path / "old", nccl_hang_dumps())
    new = write_job(tmp_path / "new", nccl_hang_dumps())
    assert "\x1b[" in invoke("diff", old, new, "--color", "always").stdout
    assert "\x1b[" not in invoke("diff", old, new).stdout


def test_quiet_keeps_errors_and_drops_notes(hang, tmp_path):
    noisy = invoke(hang, "--selected-ranks", "0")
    assert "note: --selected-ranks only narrows" in noisy.stderr
    quiet = invoke(hang, "--selected-ranks", "0", "-q")
    assert quiet.stderr == "" and quiet.stdout == noisy.stdout and quiet.exit_code == 1
    wrote = invoke(hang, "-q", "-o", tmp_path / "db.sqlite")
    assert wrote.stderr == "" and (tmp_path / "db.sqlite").exists()
    failed = invoke(tmp_path, "-q", "-o", tmp_path / "x.bad")
    assert failed.exit_code == 2 and "frtrace: error:" in failed.stderr


def _complete(words: str, env_extra=None) -> list[str]:
    env = {**os.environ, "_FRTRACE_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    done = subprocess.run([sys.executable, "-m", "frtrace"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.splitlines()]


def test_shell_completion_reaches_the_default_command_and_diff():
    assert "--selected-ranks" in _complete("frtrace --sel")
    assert "--format" in _complete("frtrace diff old new --form")
    assert set(_complete("frtrace --format ")) == {"text", "json", "markdown", "ranks"}


def _pipeline(first: list, second: list) -> tuple:
    writer = subprocess.Popen([sys.executable, "-m", "frtrace", *map(str, first)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    reader = subprocess.Popen(second, stdin=writer.stdout, stdout=subprocess.PIPE)
    writer.stdout.close()  # the reader holds the pipe's reading end alone, as a shell leaves it
    out, _ = reader.communicate(timeout=60)
    return writer.wait(timeout=60), writer.stderr.read(), out


def test_head_1_ends_the_run_with_141_and_a_whole_read_with_the_status(hang):
    code, err, out = _pipeline([hang], ["head", "-1"])
    assert (code, err, out.decode()) == (141, b"", HANG_FIRST_LINE + "\n")
    code, err, out = _pipeline([hang, "--format", "json"], ["head", "-1"])
    assert (code, out) == (141, b"{\n")
    code, _, out = _pipeline([hang], ["cat"])
    assert code == 1 and out.decode().startswith(HANG_FIRST_LINE)


def test_progress_is_drawn_on_a_terminal_only(hang):
    controller, terminal = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "frtrace", str(hang), "--workers", "1"], stdout=subprocess.PIPE,
                              stderr=terminal, timeout=60, env={**os.environ, "TERM": "xterm", "COLUMNS": "120"})
        os.close(terminal)
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's other end is closed: all is read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(controller)
    assert done.returncode == 1 and done.stdout.decode().startswith(HANG_FIRST_LINE)
    assert b"reading dumps" in drawn and b"100%" in drawn and b"4/4 dumps" in drawn
    quiet = subprocess.run([sys.executable, "-m", "frtrace", str(hang)], capture_output=True, timeout=60,
                           env={**os.environ, "COLUMNS": "120"})
    assert quiet.stderr == b"" and quiet.stdout == done.stdout
