"""Headless Chromium driven over the DevTools protocol on a pipe (no extra package, no port):
open a page, run JavaScript in it (clicks included), read its DOM, take a screenshot.

``chromium --remote-debugging-pipe`` reads DevTools commands on fd 3 and writes replies and
events on fd 4, each a JSON object ended by a NUL byte."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or \
        shutil.which("google-chrome")


class Browser:
    """One headless Chromium with one page (``with Browser() as b: b.open(url)``)."""

    def __init__(self, width: int = 1280, height: int = 1000) -> None:
        exe = chromium()
        if exe is None:
            raise RuntimeError("no chromium here")
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()
        # bash (it takes fds past 9) puts the pipes' ends on fd 3 and 4, then becomes
        # chromium (no preexec_fn: this process runs threads)
        shell = f'exec "$0" "$@" 3<&{to_chrome_r} 4>&{from_chrome_w} ' \
                f'{to_chrome_r}<&- {from_chrome_w}>&-'
        self.proc = subprocess.Popen(
            [shutil.which("bash") or "/bin/bash", "-c", shell,
             exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"],
            pass_fds=(to_chrome_r, from_chrome_w), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._n = 0
        self._buf = b""
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.call("Target.attachToTarget",
                                     {"targetId": target, "flatten": True})["sessionId"]
            self.call("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=True)
        except BaseException:  # no browser left running, no pipe left open
            self.close()
            raise

    def call(self, method: str, params: dict | None = None, session: bool = False,
             timeout: float = 30) -> dict:
        self._n += 1
        msg: dict[str, Any] = {"id": self._n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self._buf:
                left = deadline - time.monotonic()
                # a read blocks until chromium writes: wait for it no longer than the timeout
                if left <= 0 or not select.select([self._r], [], [], left)[0]:
                    raise TimeoutError(f"chromium did not answer {method}")
                chunk = os.read(self._r, 1 << 16)
                if not chunk:
                    raise EOFError("chromium closed its pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._n:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait("document.readyState === 'complete'")

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True}, session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, condition: str, timeout: float = 30) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.eval(condition)
            except RuntimeError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"never true in the page: {condition}")
            time.sleep(0.05)

    def dom(self) -> str:
        return self.eval("document.documentElement.outerHTML")

    def screenshot(self, path: Path, full: bool = True) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full:
            params["captureBeyondViewport"] = True
            size = self.eval("[document.documentElement.scrollWidth, "
                             "document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
        data = self.call("Page.captureScreenshot", params, session=True)["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
