"""A minimal headless-Chromium driver over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

Chromium reads protocol messages (JSON, each ended by a NUL byte) on file descriptor 3 and writes its
replies and events on descriptor 4, so driving it needs no chromedriver, no matching driver version and
no Python package beyond the standard library: only the ``chromium`` binary. Used by the trace viewer's
browser test and by ``dllm-rl trace --screenshot``.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic", "--disable-extensions",
    "--disable-default-apps", "--mute-audio", "--no-default-browser-check", "--hide-scrollbars",
    "--disable-dev-shm-usage", "--remote-debugging-pipe",
)
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class BrowserError(RuntimeError):
    """Chromium could not be started or did not answer."""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary: ``$CHROMIUM`` if set, else the first one on ``PATH``."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if Path(env).is_file() else shutil.which(env)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """A headless Chromium process with one page, driven synchronously over the DevTools pipe.

    >>> with Chromium() as browser:                       # doctest: +SKIP
    ...     browser.goto("file:///tmp/trace.html")
    ...     browser.evaluate("document.title")
    """

    def __init__(self, binary: str | None = None, width: int = 1200, height: int = 800, timeout: float = 30.0):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError("no chromium binary found (install the `chromium` package or set $CHROMIUM)")
        self.width, self.height, self.timeout = width, height, timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self.session: str | None = None
        self.proc: subprocess.Popen | None = None

    # ---- process -----------------------------------------------------------------------------
    def __enter__(self) -> Chromium:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="dllm-rl-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # The child must see the pipe ends as fds 3 (commands in) and 4 (replies out). Move them above 9
        # (close-on-exec) so that neither can be overwritten by the other, and remap them in the child just
        # before exec. close_fds=False is safe: Python opens every descriptor non-inheritable (PEP 446).
        child_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def remap() -> None:  # in the child, between fork and exec
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        args = [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self._profile.name}",
                f"--window-size={self.width},{self.height}", "about:blank"]
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
                                     close_fds=False, preexec_fn=remap, start_new_session=True)
        os.close(child_r)
        os.close(child_w)
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self.send("Browser.close", session=False, timeout=5)
        except Exception:  # noqa: BLE001 - the browser may already be gone
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self._stderr.close()
        self._profile.cleanup()
        self.proc = None

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-2000:]

    # ---- protocol ----------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for chromium")
            ready, _, _ = select.select([self._from_child], [], [], min(left, 0.5))
            if not ready:
                if self.proc is not None and self.proc.poll() is not None:
                    raise BrowserError(f"chromium exited with code {self.proc.returncode}: {self._stderr_tail()}")
                continue
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium closed the DevTools pipe: {self._stderr_tail()}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict[str, Any] | None = None, session: bool = True,
             timeout: float | None = None) -> dict[str, Any]:
        """Send one command and wait for its reply (events that arrive meanwhile are queued)."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session is not None:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def wait_event(self, method: str, timeout: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for i, ev in enumerate(self._events):
                if ev["method"] == method:
                    return self._events.pop(i)
            self._events.append(self._read_message(deadline))

    # ---- page helpers ------------------------------------------------------------------------
    def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self._events = [e for e in self._events if e["method"] != "Page.loadEventFired"]
        result = self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"could not open {url}: {result['errorText']}")
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """Evaluate a JavaScript expression in the page; returns its JSON value."""
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            details = res["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"javascript error: {text}")
        return res.get("result", {}).get("value")

    def center_of(self, selector: str) -> tuple[float, float]:
        rect = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        return float(rect[0]), float(rect[1])

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the centre of the element."""
        x, y = self.center_of(selector)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent",
                      {"type": kind, "x": x, "y": y, "button": "left" if kind != "mouseMoved" else "none",
                       "clickCount": 1})

    def hover(self, selector: str) -> None:
        x, y = self.center_of(selector)
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def press_key(self, key: str, code: str | None = None, key_code: int | None = None) -> None:
        """A real key press (keyDown + keyUp) sent to the focused element, e.g. ``press_key("ArrowRight")``."""
        codes = {"ArrowRight": 39, "ArrowLeft": 37, "Home": 36, "End": 35}
        vk = key_code if key_code is not None else codes.get(key, 0)
        for kind in ("rawKeyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": code or key,
                                                 "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk})

    def screenshot(self, path: str | Path | None = None, selector: str | None = None) -> bytes:
        """PNG of the viewport, or of the element ``selector`` only (written to ``path`` when given)."""
        params: dict[str, Any] = {"format": "png"}
        if selector is not None:
            x, y, w, h = self.evaluate(
                f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                " return [r.x, r.y, r.width, r.height]; })()")
            params["clip"] = {"x": x, "y": y, "width": w, "height": h, "scale": 1}
        data = base64.b64decode(self.send("Page.captureScreenshot", params)["data"])
        if path is not None:
            Path(path).write_bytes(data)
        return data


def screenshot_file(html_path: str | Path, png_path: str | Path, step: int | None = None,
                    width: int = 1200, height: int = 800) -> Path:
    """Open a trace HTML file in headless Chromium, optionally set the slider to ``step``, save a PNG."""
    html_path = Path(html_path).resolve()
    with Chromium(width=width, height=height) as browser:
        browser.goto(html_path.as_uri())
        if step is not None:
            browser.evaluate(
                f"(() => {{ const s = document.getElementById('slider'); s.value = '{int(step)}';"
                " s.dispatchEvent(new Event('input')); return s.value; })()")
        browser.screenshot(png_path)
    return Path(png_path)
