"""The HTML report holds on a 1,440-pixel screen and on a 390-pixel phone (issue 25 item 3):
nothing overflows the page (wide tables scroll in their own box, long strings wrap),
checked in headless Chromium through chromedriver, with a screenshot at each width.

Needs the Debian packages chromium and chromium-driver (`.ci/run` installs them); skips
with the reason when they are absent.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import analyse_dicts, job

from frtrace.report.html import render_html
from frtrace.testing.synth import Fault, generate

WIDTHS = (1440, 390)
RLO = "\u202e"  # right-to-left override: would mirror the text after it
LONG = "x" * 5000  # one unbroken string from a dump

# For every element outside a scroll box (and each box itself): does it stay inside the
# viewport? Collapsed <details> are opened first so that their findings count too.
OVERFLOW_SCRIPT = """
document.querySelectorAll('details').forEach(d => { d.open = true; });
const width = document.documentElement.clientWidth;
const out = [];
for (const el of document.body.querySelectorAll('*')) {
  const box = el.parentElement && el.parentElement.closest('.scroll');
  if (box) continue;
  const r = el.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue;
  if (r.right > width + 1 || r.left < -1) out.push(el.tagName + '.' + el.className + ' right=' + Math.round(r.right));
}
return {width: width, inner: window.innerWidth, scroll_width: document.documentElement.scrollWidth,
        ratio: window.devicePixelRatio, overflowing: out.slice(0, 10), verdict: document.getElementById('verdict').textContent};
"""


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(f"no {names[0]} binary (apt-get install chromium chromium-driver) to lay the HTML report out")


class WebDriver:
    """The few W3C WebDriver calls the test needs, over HTTP to a local chromedriver."""

    def __init__(self, driver: str, browser: str):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen([driver, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                pytest.fail("chromedriver did not start within 30 s")
            time.sleep(0.1)
        options = {"binary": browser, "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                               "--force-device-scale-factor=1"]}
        session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}})
        self.session = f"/session/{session['sessionId']}"

    def _call(self, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())["value"]

    def layout(self, page: Path, width: int) -> tuple[dict, bytes]:
        """Open `page` in a viewport `width` pixels wide: the overflow check and a screenshot."""
        self._call("POST", f"{self.session}/window/rect", {"width": width, "height": 900})
        inner = self._call("POST", f"{self.session}/execute/sync", {"script": "return window.innerWidth", "args": []})
        if inner != width:  # the window's frame: make the viewport itself `width` wide
            self._call("POST", f"{self.session}/window/rect", {"width": 2 * width - inner, "height": 900})
        self._call("POST", f"{self.session}/url", {"url": page.as_uri()})
        measured = self._call("POST", f"{self.session}/execute/sync", {"script": OVERFLOW_SCRIPT, "args": []})
        shot = base64.b64decode(self._call("GET", f"{self.session}/screenshot"))
        return measured, shot

    def close(self) -> None:
        try:
            if hasattr(self, "session"):
                self._call("DELETE", self.session)
        finally:
            self.process.terminate()
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    driver = WebDriver(_binary("chromedriver", "chromium-driver"), _binary("chromium", "chromium-browser", "google-chrome"))
    yield driver
    driver.close()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def hang_at(world: int):
    """A TP x PP x DP job of `world` ranks where one rank never joins a TP all_reduce."""
    synth = generate(world, tp=8, pp=4, steps=2, timing=True, fault=Fault("hang", rank=37, group="tp", step=1))
    return analyse_dicts(dict(synth.dumps), render=False)


def hostile_strings():
    """Group names and descriptions a dump could carry: bidi overrides, 5,000 characters
    without a space, markup."""
    name, desc = f"tp{RLO}gnp.exe{LONG}", f"<b>desc</b>{RLO}{LONG}"
    steps = {0: [f"all_reduce@{name}"] * 2, 1: [f"all_reduce@{name}"] * 2, 2: [f"all_reduce@{name}"]}
    return analyse_dicts(job(steps, groups={name: (desc, (0, 1, 2))}), render=False)


def check_layout(browser: WebDriver, page: Path, shots: Path) -> list:
    """The page at each width: nothing outside the viewport, a screenshot of that width."""
    results = []
    for width in WIDTHS:
        measured, shot = browser.layout(page, width)
        (shots / f"{page.stem}-{width}.png").write_bytes(shot)
        assert measured["inner"] == width, measured
        assert not measured["overflowing"], (width, measured["overflowing"])
        assert measured["scroll_width"] <= measured["width"], measured
        assert _png_size(shot)[0] == round(width * measured["ratio"]) and len(shot) > 5_000
        results.append(measured)
    return results


@pytest.mark.parametrize("world", [1024])
def test_a_large_hang_holds_at_desktop_and_phone_width(browser, tmp_path, world):
    analysis, diagnosis = hang_at(world)
    page = tmp_path / f"hang{world}.html"
    page.write_text(render_html(analysis, diagnosis), encoding="utf-8")
    for measured in check_layout(browser, page, tmp_path):
        assert measured["verdict"] == diagnosis.verdict


def test_bidi_controls_and_long_unbroken_strings_neither_reorder_nor_widen_the_page(browser, tmp_path):
    analysis, diagnosis = hostile_strings()
    html = render_html(analysis, diagnosis)
    assert RLO not in html and "\\u202e" in html  # shown as an escape, never applied
    assert "<b>desc" not in html
    page = tmp_path / "hostile.html"
    page.write_text(html, encoding="utf-8")
    check_layout(browser, page, tmp_path)
