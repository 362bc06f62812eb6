"""Drive headless Chromium over the DevTools protocol, for the book's tests and screenshots.

Only the standard library and ``websocket-client`` (a dependency of jupyter_server) are
needed: Chromium is started with ``--remote-debugging-port=0``, writes the port it
chose into its profile folder, and we talk JSON over one websocket. One tab is opened
and attached in "flat" session mode; everything the page does (console messages,
exceptions, requests, failed loads) is recorded as events, so a caller can ask after
a page load what went wrong. Flags follow TOOLCHAIN.md: no sandbox, no GPU, no
background networking, a fresh profile each time.
"""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-allow-origins=*", "--hide-scrollbars",
]
# URL schemes a page may load from without touching the network.
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")

# Ready when images have loaded, math is typeset and every widget view has rendered.
READY_JS = """(() => {
  const imgs = [...document.images].every(i => i.complete);
  const math = [...document.querySelectorAll('.math')].every(m => m.querySelector('mjx-container'));
  const views = [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')];
  const widgets = views.every(v => v.parentElement.querySelector('.jupyter-widgets'));
  const search = !document.getElementById('search-results')
      || /Search finished/.test(document.getElementById('search-results').innerText);
  return imgs && math && widgets && search;
})()"""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless Chromium with one tab, driven over the DevTools protocol (websocket)."""

    def __init__(self, executable: str, profile: Path, width: int = 1280, height: int = 900):
        import websocket  # websocket-client (a dependency of jupyter_server)

        profile = Path(profile)
        self.proc = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS, f"--window-size={width},{height}", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and len(port_file.read_text().split()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port, path = port_file.read_text().split()[:2]
        self.ws = None
        self.next_id = 0
        self.events: list[dict] = []
        try:
            self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=30, suppress_origin=True)
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.send(f"{domain}.enable", session=True)
        except Exception:
            self.close()
            raise

    def send(self, method: str, params: dict | None = None, session: bool = False, timeout: float = 30) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(method)

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        return result.get("result", {}).get("value")

    def open(self, url: str, ready_js: str, timeout: float = 15) -> None:
        """Navigate, wait for the load event, then until ``ready_js`` is true (or timeout)."""
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.evaluate("1")  # pumps events while we wait
            time.sleep(0.05)
        while time.monotonic() < deadline and not self.evaluate(ready_js):
            time.sleep(0.1)
        time.sleep(0.2)  # let late console messages and requests arrive
        self.evaluate("1")

    def problems(self) -> list[str]:
        found, urls = [], {}
        for event in self.events:
            if event.get("sessionId") != self.session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append("JS exception: " + details.get("exception", {}).get("description", details.get("text", "")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                found.append(f"console.{params['type']}: {text}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                found.append(f"browser error: {entry.get('text')} {entry.get('url', '')}".strip())
            elif method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                urls[params["requestId"]] = url
                if not url.startswith(LOCAL_SCHEMES):
                    found.append(f"network request: {url}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                found.append(f"failed to load {urls.get(params['requestId'], '?')}: {params.get('errorText')}")
        return found

    def screenshot(self, out: Path, selector: str | None = None) -> Path:
        """Write a PNG of the window, scrolled so that ``selector``'s element is at the top."""
        if selector:
            found = self.evaluate(
                f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return false;"
                " window.scrollTo(0, e.getBoundingClientRect().top + window.scrollY - 64); return true; })()"
            )
            if not found:
                raise ValueError(f"no element matches {selector!r} on this page")
            time.sleep(0.3)  # let the theme's scroll handlers settle (64 px: below the sticky header)
        shot = self.send("Page.captureScreenshot", {"format": "png"}, session=True)
        out = Path(out)
        out.write_bytes(base64.b64decode(shot["data"]))
        return out

    def close(self):
        if self.__dict__.get("ws") is not None:
            try:
                self.ws.close()
            except Exception:
                pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
