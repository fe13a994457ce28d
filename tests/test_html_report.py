"""The self-contained HTML report: escaped, offline, and rendered by a real browser."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from helpers import analyse_dicts, copy_fixture, job, run_cli, write_job

from frtrace.report.html import render_html

HOSTILE = 'a|b<img src=x onerror=alert(1)>"c"'


def _hostile():
    steps = {0: ["all_reduce@" + HOSTILE] * 2, 1: ["all_reduce@" + HOSTILE] * 2, 2: ["all_reduce@" + HOSTILE]}
    return analyse_dicts(job(steps, groups={HOSTILE: ("desc<script>x</script>", (0, 1, 2))}), render=False)


def test_html_escapes_every_dump_string_and_loads_nothing():
    analysis, diagnosis = _hostile()
    page = render_html(analysis, diagnosis)
    assert "<img" not in page and "<script" not in page
    assert "a|b&lt;img src=x onerror=alert(1)&gt;&#34;c&#34;" in page
    assert "desc&lt;script&gt;x&lt;/script&gt;" in page
    # no external request: no URL, no src/href attribute, a policy forbidding any
    tags = re.findall(r"<[^>]*>", page)
    assert {re.match(r"</?([a-z0-9!]+)", t.lower()).group(1) for t in tags} <= {
        "!doctype", "html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "div", "strong", "section",
        "article", "p", "dl", "dt", "dd", "code", "details", "summary", "table", "thead", "tbody", "tr", "th", "td",
        "small", "b", "span", "footer", "br"}
    # attribute names outside the (escaped) quoted values: never one that loads something
    assert not any(re.search(r"\b(src|href|style|on\w+)\s*=", re.sub(r'"[^"]*"', '""', t)) for t in tags)
    assert not re.search(r"https?://|@import|url\(", page)
    assert "default-src 'none'" in page


def test_html_option_writes_the_report_and_is_checked_before_reading(tmp_path):
    directory = write_job(tmp_path / "dumps", job({0: ["all_reduce"] * 2, 1: ["all_reduce"] * 2, 2: ["all_reduce"]}))
    out = tmp_path / "report.html"
    result = run_cli([directory, "--html", out])
    assert result.exit_code == 1 and out.exists()
    assert "wrote" in result.stderr and "HTML report" in result.stderr
    again = run_cli([directory, "--html", out])
    assert again.exit_code == 2 and "already exists" in again.stderr
    wrong = run_cli([directory, "--html", tmp_path / "report.txt"])
    assert wrong.exit_code == 2 and "unsupported html file type" in wrong.stderr
    same = run_cli([directory, "--html", tmp_path / "x.html", "--timeline", tmp_path / "x.html"])
    assert same.exit_code == 2
    assert run_cli([directory, "-j", "--html", tmp_path / "y.html"]).exit_code == 2


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium binary found (apt-get install chromium) to render the HTML report")


def test_html_report_renders_in_headless_chromium(tmp_path):
    browser = _chromium()
    dumps = copy_fixture("hang_never_arrives", tmp_path / "dumps")
    page = tmp_path / "report.html"
    assert run_cli([dumps, "--html", page]).exit_code == 1
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,900"]
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = re.sub(r"<[^>]+>", " ", dom.stdout)
    assert "FAULT: rank 2 never issued all_reduce #4 in group 0 (default_pg)" in text
    assert re.search(r'id="suspects">2<', dom.stdout)
    assert "/workspace/job/train.py:278 in three_then_hang" in text
    shot = tmp_path / "report.png"
    subprocess.run(flags + [f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, cwd=tmp_path)
    assert shot.exists() and shot.stat().st_size > 10_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
