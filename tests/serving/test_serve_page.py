"""The page at ``GET /`` in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven over the W3C WebDriver protocol with plain HTTP, no extra Python
package) loads it from ``xmc-serve`` on 127.0.0.1, a text is typed, k is changed, Predict is
clicked and the labels appear with their names and score bars, as ``POST /predict`` gives them.
The screenshot is saved as a test artifact (``$XMC_TEST_ARTIFACTS``, default
``outputs/test-artifacts/serve-page.png``, ignored by git)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from model_helpers import save_toy_xrlinear
from serve_helpers import HOST, free_port, start

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="needs Debian's chromium and chromium-driver "
    "(apt-get install -y chromium chromium-driver; .ci/run installs them)",
)
ARTIFACTS = Path(
    os.environ.get("XMC_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "outputs" / "test-artifacts")
)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1000,900",
]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference


class Browser:
    """The few WebDriver commands the test needs, over HTTP to a local chromedriver."""

    def __init__(self, profile: Path):
        self.port = free_port()
        self.driver = subprocess.Popen(
            [DRIVER, f"--port={self.port}", "--allowed-ips=127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.http = httpx.Client(base_url=f"http://{HOST}:{self.port}", timeout=60)
        for _ in range(200):  # bounded: ~20 s for the driver to listen
            try:
                if self.http.get("/status").json()["value"]["ready"]:
                    break
            except (httpx.TransportError, ValueError, KeyError):
                time.sleep(0.1)
        caps = {
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {"binary": CHROMIUM, "args": [*FLAGS, f"--user-data-dir={profile}"]},
                }
            }
        }
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method: str, path: str, body: dict | None = None):
        r = self.http.request(method, path, json=body if body is not None else ({} if method == "POST" else None))
        value = r.json()["value"]
        if r.status_code != 200:
            raise RuntimeError(f"webdriver {method} {path}: {value.get('message', value)}")
        return value

    def s(self, method: str, path: str, body: dict | None = None):
        return self.call(method, f"/session/{self.session}{path}", body)

    def find(self, css: str) -> str:
        return self.s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def script(self, js: str):
        return self.s("POST", "/execute/sync", {"script": js, "args": []})

    def close(self) -> None:
        try:
            self.call("DELETE", f"/session/{self.session}")
        finally:
            self.http.close()
            self.driver.terminate()
            self.driver.wait(timeout=30)


def test_page_in_headless_chromium_shows_the_labels(tmp_path):
    folder, texts = save_toy_xrlinear(tmp_path / "xrlinear")
    served = start(folder)
    browser = None
    try:
        text = texts["test"][0]
        expected = httpx.post(f"{served.base}/predict", json={"texts": [text], "k": 4}, timeout=30).json()
        expected = expected["predictions"][0]
        browser = Browser(tmp_path / "profile")
        browser.s("POST", "/url", {"url": f"{served.base}/"})
        for _ in range(100):  # the page asks /health for the model line
            if "labels" in browser.script("return document.getElementById('model').textContent;"):
                break
            time.sleep(0.1)
        assert browser.script("return document.getElementById('model').textContent;") == "xrlinear model, 12 labels"
        box = browser.find("#text")
        browser.s("POST", f"/element/{box}/value", {"text": text})
        k = browser.find("#k")
        browser.s("POST", f"/element/{k}/clear")
        browser.s("POST", f"/element/{k}/value", {"text": "4"})
        browser.s("POST", f"/element/{browser.find('#go')}/click")
        shown = []
        for _ in range(100):  # bounded: ~10 s for the labels to appear
            shown = browser.script(
                "return Array.from(document.querySelectorAll('#labels li')).map(li => "
                "[li.querySelector('.name').firstChild.textContent, li.querySelector('.id').textContent, "
                "li.querySelector('.fill').style.width, li.querySelector('.score').textContent]);"
            )
            if shown:
                break
            time.sleep(0.1)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        png = base64.b64decode(browser.s("GET", "/screenshot"))
        (ARTIFACTS / "serve-page.png").write_bytes(png)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        assert [row[0] for row in shown] == expected["names"]
        assert [row[1] for row in shown] == expected["labels"]
        widths = [float(row[2].rstrip("%")) for row in shown]
        assert widths == sorted(widths, reverse=True) and widths[0] > 0
        assert browser.script("return document.getElementById('status').className;") == ""
        # a bad k is clamped to the server's limit, not sent
        browser.s("POST", f"/element/{k}/clear")
        browser.s("POST", f"/element/{k}/value", {"text": "1000"})
        browser.s("POST", f"/element/{browser.find('#go')}/click")
        for _ in range(100):
            if browser.script("return document.getElementById('k').value;") == "100":
                break
            time.sleep(0.1)
        assert browser.script("return document.getElementById('k').value;") == "100"
    finally:
        if browser is not None:
            browser.close()
        served.stop()
