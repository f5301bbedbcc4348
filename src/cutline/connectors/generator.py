"""A deterministic, replayable, optionally rate-limited source of ``fn(i)`` for i = 0, 1, 2..."""

from __future__ import annotations

import time
from typing import Any, Callable

from ..protocol.watermarks import next_split


def _identity(i: int) -> int:
    return i


class Pacer:
    """A token bucket for a source subtask: at most ``per_sec`` records a second.

    It starts empty, refills at ``per_sec`` and holds at most ~0.1 s worth (>= 1), so a slow
    consumer does not cause a burst above the rate afterwards.  :meth:`allowance` sleeps at
    most ``step`` seconds, so a reader is never blocked for long."""

    def __init__(self, per_sec: float, step: float) -> None:
        self.per_sec, self.step = per_sec, step
        self._cap = max(1.0, per_sec * 0.1)
        self._tokens, self._last = 0.0, time.monotonic()

    def allowance(self, want: int) -> int:
        """How many records may be emitted now (sleeping up to ``step`` to let one come due)."""
        deadline = time.monotonic() + self.step
        while True:
            now = time.monotonic()
            self._tokens = min(self._cap, self._tokens + (now - self._last) * self.per_sec)
            self._last = now
            if self._tokens >= 1.0:
                n = min(want, int(self._tokens))
                self._tokens -= n
                return n
            wait = min((1.0 - self._tokens) / self.per_sec, deadline - now)
            if wait <= 0:
                return 0
            time.sleep(wait)


class GeneratorSource:
    """Subtask ``s`` of ``p`` emits ``fn(i)`` for ``i % p == s``, ``i < count``, in order
    (after a rescaled restore, its share of the old subtasks' remaining indices).

    ``count=None`` is unbounded. ``rate`` caps the total records/s over all subtasks (each
    subtask gets ``rate / p``; ``read_batch`` sleeps in steps of at most ``step`` seconds and
    returns ``[]`` if no record is due yet, so a caller is never blocked for long). The position
    is the next index, so replay after ``restore`` is exact as long as ``fn`` is deterministic.

    The default ``fn`` is a module-level function so the source pickles with plain ``pickle``;
    a lambda or closure needs cloudpickle (which PySpark uses).

    ``batch_fn``: a *batch stream* instead (Arrow record batches): ``batch_fn(indices)``
    gets a numpy int64 array of up to ``batch_rows`` indices (the same indices, in the same
    order, as ``fn`` would get one by one) and returns a ``pyarrow.RecordBatch`` (or
    ``Table``) with one row per index.
    """

    def __init__(self, count: int | None = None, rate: float | None = None,
                 fn: Callable[[int], Any] = _identity, name: str = "generator",
                 step: float = 0.05, *, batch_fn: Callable[[Any], Any] | None = None,
                 batch_rows: int = 8192):
        if count is not None and count < 0:
            raise ValueError(f"count must be >= 0 or None, got {count}")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 records/s or None, got {rate}")
        if batch_fn is not None and not callable(batch_fn):
            raise TypeError(f"batch_fn must be a function of an index array, got {batch_fn!r}")
        if not isinstance(batch_rows, int) or isinstance(batch_rows, bool) or batch_rows < 1:
            raise ValueError(f"batch_rows must be a whole number >= 1, got {batch_rows!r}")
        self.count, self.rate, self.fn, self.name, self.step = count, rate, fn, name, step
        self.batch_fn, self.batch_rows = batch_fn, batch_rows

    @property
    def columnar(self) -> bool:
        """A batch stream (``batch_fn``): every read is a list of Arrow record batches."""
        return self.batch_fn is not None

    def parallelism_hint(self) -> int | None:
        return None

    def records(self, start: int, stride: int, n: int) -> list:
        """Records ``fn(start)``, ``fn(start + stride)``, ... (``n`` of them); a subclass
        may generate them in one go (``NexmarkSource``: vectorised)."""
        return list(map(self.fn, range(start, start + n * stride, stride)))

    def create_reader(self) -> "GeneratorReader":
        return GeneratorReader(self)

    def __repr__(self) -> str:
        return f"GeneratorSource(count={self.count}, rate={self.rate}, name={self.name!r})"


class GeneratorReader:
    """Reads *splits*: ``[next, stride]`` is the arithmetic sequence ``next, next + stride, ...``
    below ``count``.  A fresh subtask ``s`` of ``p`` reads the one split ``[s, p]``.  On a
    rescaled restore the old splits are cut in two until there are enough for every reader
    and shared out (Flink's source splits), so no index is lost or read twice."""

    def __init__(self, source: GeneratorSource):
        self._src = source
        self._subtask: int | None = None
        self._parallelism: int | None = None
        self._splits: list[list[int]] = []
        self._k = 0  # the split read next (round robin over batches)
        self._last_split: str | None = None  # the split the last batch came from
        self._split_wm: Any = None  # read aligned: each split's watermark (split -> ts)

    def open(self, subtask: int, parallelism: int) -> None:
        if not 0 <= subtask < parallelism:
            raise ValueError(f"subtask {subtask} out of range for parallelism {parallelism}")
        self._subtask, self._parallelism = subtask, parallelism
        self._splits = [[subtask, parallelism]]
        rate = self._src.rate
        self._pacer = None if rate is None else Pacer(rate / parallelism, self._src.step)

    def _left(self, split: list[int]) -> int | None:
        count = self._src.count
        if count is None:
            return None
        nxt, stride = split
        return 0 if nxt >= count else (count - 1 - nxt) // stride + 1

    def _remaining(self) -> int | None:
        if self._src.count is None:
            return None if self._splits else 0
        return sum(self._left(sp) or 0 for sp in self._splits)  # ints: count is known

    def read_batch(self, max_records: int) -> list | None:
        if self._parallelism is None:
            raise RuntimeError("GeneratorReader.read_batch() before open()")
        while self._splits and self._left(self._splits[self._k % len(self._splits)]) == 0:
            del self._splits[self._k % len(self._splits)]
        if self._split_wm is not None:  # aligned: every finished split goes
            self._splits = [sp for sp in self._splits if self._left(sp) != 0]
        if not self._splits:
            return None
        self._k %= len(self._splits)
        probe = False
        if self._split_wm is not None and len(self._splits) > 1:  # aligned: furthest behind
            keys = [self._key(sp) for sp in self._splits]
            first = next_split(keys, self._split_wm)
            self._k = 0 if first is None else keys.index(first)  # None: never (2+ splits)
            probe = keys[self._k] not in self._split_wm  # not begun: a record first
        split = self._splits[self._k]
        left = self._left(split)
        if self._src.batch_fn is not None:
            max_records = self._src.batch_rows
        if probe:
            max_records = 1
        want = max_records if left is None else min(max_records, left)
        n = max(0, want) if self._pacer is None else self._pacer.allowance(max(0, want))
        i, stride = split
        self._last_split = self._key(split)
        self._last_batch = (i, stride, n)
        if self._src.batch_fn is None:
            out = self._src.records(i, stride, n)
        else:
            from .arrow_files import batch_of

            out = batch_of(self._src.batch_fn, i, stride, n) if n else []
        split[0] = i + n * stride
        if len(self._splits) > 1:
            self._k += 1
        return out

    @staticmethod
    def _key(split: list[int]) -> str:
        return f"{split[0] % split[1]}/{split[1]}"  # stays as the split advances

    def watermark_per_split(self, watermarks: Any = None) -> None:
        """``watermarks`` (each split's watermark, ``.get(split, default)``): read the
        splits aligned, each batch from the unfinished split furthest behind."""
        self._split_wm = watermarks

    def split_key(self) -> str | None:
        """The split the last batch came from (a batch comes from one split): event time
        keeps one watermark per split (``assign_timestamps`` in the source's tasks)."""
        return self._last_split

    def split_keys(self) -> list[str]:
        """The splits this reader still reads."""
        return [self._key(sp) for sp in self._splits if self._left(sp) != 0]

    def locate(self, index: int | None = None) -> str | None:
        """Where record ``index`` of the last batch came from (the whole batch if None)."""
        last = getattr(self, "_last_batch", None)
        if last is None:
            return None
        i, stride, n = last
        if index is not None and 0 <= index < n:
            return f"generated record {i + index * stride} (fn's argument)"
        last = i + max(n - 1, 0) * stride
        if stride == 1 or n <= 2:
            return f"generated records {i} to {last}"
        return f"generated records {i}, {i + stride}, ..., {last}"

    def snapshot(self) -> dict:
        return {"splits": [list(sp) for sp in self._splits], "subtask": self._subtask,
                "parallelism": self._parallelism}

    @staticmethod
    def _splits_of(state: dict) -> list[list[int]]:
        if "splits" in state:
            return [[int(n), int(s)] for n, s in state["splits"]]
        return [[int(state["next"]), int(state["parallelism"])]]  # before splits existed

    def restore(self, state: dict) -> None:
        if state.get("subtask", self._subtask) != self._subtask or \
                state.get("parallelism", self._parallelism) != self._parallelism:
            raise ValueError(
                f"generator position {state} was taken by another subtask/parallelism; this "
                f"reader is subtask {self._subtask} of {self._parallelism}")
        self._splits, self._k = self._splits_of(state), 0

    def rescale(self, states: list[dict]) -> None:
        """Take this reader's share of every old reader's splits (a rescaled restore)."""
        splits = sorted(sp for st in states for sp in self._splits_of(st)
                        if self._left(sp) != 0)
        p = self._parallelism
        if p is None:
            raise RuntimeError("GeneratorReader.rescale() before open()")
        while len(splits) < p:  # cut splits in two (evens, odds) so every reader gets work
            cut = []
            for nxt, stride in splits:
                halves = [[nxt, 2 * stride], [nxt + stride, 2 * stride]]
                cut += [h for h in halves if self._left(h) != 0]
            if len(cut) == len(splits):
                break  # nothing left to cut
            splits = sorted(cut)
        self._splits = [sp for i, sp in enumerate(splits) if i % p == self._subtask]
        self._k = 0

    def close(self) -> None:
        pass
