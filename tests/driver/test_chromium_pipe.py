"""tests/chromium.py's DevTools pipe: a call to a browser that does not answer raises
TimeoutError after its timeout (a blocking read used to wait forever, and so did close())."""

from __future__ import annotations

import os
import threading

from chromium import Browser


def test_a_call_that_chromium_never_answers_times_out():
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()  # nothing is ever written here
    b = Browser.__new__(Browser)  # the pipes of a browser that hangs, without a browser
    b._r, b._w, b._n, b._buf, b.session = from_chrome_r, to_chrome_w, 0, b"", "s"
    raised: list[BaseException] = []

    def call() -> None:
        try:
            b.call("Runtime.evaluate", timeout=0.5)
        except BaseException as exc:  # noqa: BLE001 - what it raised is the test
            raised.append(exc)

    t = threading.Thread(target=call, daemon=True)
    try:
        t.start()
        t.join(60)  # a generous bound: the call's own timeout is 0.5 s
        hung = t.is_alive()
    finally:
        os.write(from_chrome_w, b'{"id": 0}\0')  # (wakes a read that blocked: the old code)
        t.join(10)
        for fd in (to_chrome_r, to_chrome_w, from_chrome_r, from_chrome_w):
            os.close(fd)
    assert not hung, "the call did not honour its timeout"
    assert len(raised) == 1 and isinstance(raised[0], TimeoutError), raised
    assert "did not answer Runtime.evaluate" in str(raised[0])
