"""A deterministic, replayable, optionally rate-limited source of ``fn(i)`` for i = 0, 1, 2..."""

from __future__ import annotations

import time
from typing import Any, Callable


def _identity(i: int) -> int:
    return i


class GeneratorSource:
    """Subtask ``s`` of ``p`` emits ``fn(i)`` for ``i % p == s``, ``i < count``, in order.

    ``count=None`` is unbounded. ``rate`` caps the total records/s over all subtasks (each
    subtask gets ``rate / p``; ``read_batch`` sleeps in steps of at most ``step`` seconds and
    returns ``[]`` if no record is due yet, so a caller is never blocked for long). The position
    is the next index, so replay after ``restore`` is exact as long as ``fn`` is deterministic.

    The default ``fn`` is a module-level function so the source pickles with plain ``pickle``;
    a lambda or closure needs cloudpickle (which PySpark uses).
    """

    def __init__(self, count: int | None = None, rate: float | None = None,
                 fn: Callable[[int], Any] = _identity, name: str = "generator",
                 step: float = 0.05):
        if count is not None and count < 0:
            raise ValueError(f"count must be >= 0 or None, got {count}")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 records/s or None, got {rate}")
        self.count, self.rate, self.fn, self.name, self.step = count, rate, fn, name, step

    def parallelism_hint(self) -> int | None:
        return None

    def create_reader(self) -> "GeneratorReader":
        return GeneratorReader(self)

    def __repr__(self) -> str:
        return f"GeneratorSource(count={self.count}, rate={self.rate}, name={self.name!r})"


class GeneratorReader:
    def __init__(self, source: GeneratorSource):
        self._src = source
        self._subtask = self._parallelism = None
        self._next = 0

    def open(self, subtask: int, parallelism: int) -> None:
        if not 0 <= subtask < parallelism:
            raise ValueError(f"subtask {subtask} out of range for parallelism {parallelism}")
        self._subtask, self._parallelism, self._next = subtask, parallelism, subtask
        rate = self._src.rate
        self._per_sec = None if rate is None else rate / parallelism
        # Token bucket: starts empty, refills at _per_sec, holds at most ~0.1 s worth (>= 1)
        # so a slow consumer does not cause a burst above the rate afterwards.
        self._tokens, self._last = 0.0, time.monotonic()
        self._cap = None if rate is None else max(1.0, self._per_sec * 0.1)

    def _remaining(self) -> int | None:
        count = self._src.count
        if count is None:
            return None
        if self._next >= count:
            return 0
        return (count - 1 - self._next) // self._parallelism + 1

    def _allowance(self, want: int) -> int:
        """How many records may be emitted now (sleeping up to ``step`` to let one come due)."""
        if self._per_sec is None:
            return want
        deadline = time.monotonic() + self._src.step
        while True:
            now = time.monotonic()
            self._tokens = min(self._cap, self._tokens + (now - self._last) * self._per_sec)
            self._last = now
            if self._tokens >= 1.0:
                n = min(want, int(self._tokens))
                self._tokens -= n
                return n
            wait = min((1.0 - self._tokens) / self._per_sec, deadline - now)
            if wait <= 0:
                return 0
            time.sleep(wait)

    def read_batch(self, max_records: int) -> list | None:
        if self._parallelism is None:
            raise RuntimeError("GeneratorReader.read_batch() before open()")
        remaining = self._remaining()
        if remaining == 0:
            return None
        want = max_records if remaining is None else min(max_records, remaining)
        n = self._allowance(max(0, want))
        fn, p, i = self._src.fn, self._parallelism, self._next
        out = list(map(fn, range(i, i + n * p, p)))
        self._next = i + n * p
        return out

    def snapshot(self) -> dict:
        return {"next": self._next, "subtask": self._subtask, "parallelism": self._parallelism}

    def restore(self, state: dict) -> None:
        nxt = int(state["next"])
        p = state.get("parallelism", self._parallelism)
        if p != self._parallelism or nxt % self._parallelism != self._subtask:
            raise ValueError(
                f"generator position {state} was taken by another subtask/parallelism; "
                f"this reader is subtask {self._subtask} of {self._parallelism} "
                "(the generator source cannot be rescaled)")
        self._next = nxt

    def close(self) -> None:
        pass
