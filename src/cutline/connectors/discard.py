"""``DiscardSink``: drops every record and counts it, for benchmarks and tests."""

from __future__ import annotations

import json

from ..storage.fs import check_storage_options
from .base import get_fs, join, rm_quiet


class DiscardSink:
    """Drop every record, counting it: keeps the sink out of a benchmark, or ends a test
    pipeline whose output does not matter.

    A batch stream's record batches count their rows.  Nothing is written, so nothing is
    staged and nothing can be lost: it needs no two-phase commit and works in every
    checkpoint mode (aligned, unaligned, at-least-once), on Spark and on the threads engine.
    Each subtask's transaction handle carries its running count, so the count is restored
    with the checkpoint: after a failure, ``count()`` is exactly the records a failure-free
    run counts (in exactly-once modes; at-least-once counts what arrived, duplicates
    included).

    ``count(job=None)`` returns the records of the committed checkpoints:

    * with ``path`` (a directory or fsspec URL the driver and every executor share), read
      from the small file each subtask rewrites there on commit (``<path>/<job>/
      count-<subtask>.json``): this works on Spark;
    * without ``path``, from the writers that ran in this process: the threads engine, or
      a writer driven by hand.

    Example::

        from cutline import DiscardSink, Pipeline
        from cutline.connectors import GeneratorSource

        sink = DiscardSink()
        p = Pipeline("bench", parallelism=2)
        p.source(GeneratorSource(count=1_000_000), uid="n").map(str, uid="fmt").sink(sink)
        result = p.run(engine="threads")
        assert sink.count() == 1_000_000
        print(f"{1_000_000 / result.duration:,.0f} records/s")
    """

    def __init__(self, path: str | None = None, name: str = "discard", *,
                 storage_options: dict | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.name = name
        self.storage_options = check_storage_options(storage_options)
        # committed count of each (job, subtask) whose writer ran in this process
        self._local: dict[tuple[str, int], int] = {}

    def create_writer(self) -> DiscardWriter:
        return DiscardWriter(self)

    def count(self, job: str | None = None) -> int:
        """Records committed so far, of one job or of all."""
        if self.path is None:
            return sum(n for (j, _), n in self._local.items() if job in (None, j))
        fs, root = get_fs(self.path, self.storage_options)
        if not fs.exists(root):
            return 0
        jobs = [job] if job is not None else [
            d.rstrip("/").rsplit("/", 1)[-1] for d in fs.ls(root, detail=False)]
        total = 0
        for j in jobs:
            jdir = join(root, j)
            if not fs.exists(jdir):
                continue
            for f in fs.ls(jdir, detail=False):
                name = f.rstrip("/").rsplit("/", 1)[-1]
                if name.startswith("count-") and name.endswith(".json"):
                    with fs.open(f, "rb") as fh:
                        total += int(json.load(fh)["records"])
        return total

    def __getstate__(self) -> dict:
        state = dict(vars(self))
        state["_local"] = {}  # another process counts for itself
        return state

    def __repr__(self) -> str:
        return f"DiscardSink({self.path!r})" if self.path is not None else "DiscardSink()"


class DiscardWriter:
    """Counts; a handle is ``{"checkpoint_id", "subtask", "records", "total"}``: the records
    since the previous pre-commit and the subtask's running total up to this checkpoint."""

    def __init__(self, sink: DiscardSink) -> None:
        self._sink = sink
        self.records = 0  # written, committed or not
        self._committed = 0
        self._subtask = 0
        self._job = ""
        self._at_last_pre_commit = 0

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        if not 0 <= subtask < parallelism:
            raise ValueError(f"subtask {subtask} out of range for parallelism {parallelism}")
        self._subtask, self._parallelism, self._job = subtask, parallelism, job

    def write(self, batch: list) -> None:
        if batch and hasattr(batch[0], "num_rows"):  # a batch stream: count rows
            self.records += sum(b.num_rows for b in batch)
        else:
            self.records += len(batch)

    def pre_commit(self, checkpoint_id: int) -> dict:
        since, self._at_last_pre_commit = self.records - self._at_last_pre_commit, self.records
        return {"checkpoint_id": int(checkpoint_id), "subtask": self._subtask,
                "records": since, "total": self.records}

    def commit(self, handles: list[dict]) -> None:
        total = max((int(h["total"]) for h in handles), default=-1)
        if total > self._committed:
            self._publish(total)

    def abort(self, handles: list[dict]) -> None:
        pass

    def recover(self, handles: list[dict]) -> None:
        """Continue from the restored checkpoint's count.  After a rescale a subtask gets the
        handles of the old subtasks it replaces: their totals add up."""
        last: dict[int, int] = {}
        for h in handles:
            s = int(h.get("subtask", self._subtask))
            last[s] = max(last.get(s, 0), int(h["total"]))
        self.records = self._at_last_pre_commit = sum(last.values())
        self._committed = -1  # publish even an unchanged count: the restored one is the truth
        self._drop_replaced_subtasks()
        self._publish(self.records)

    def close(self) -> None:
        pass

    def _publish(self, total: int) -> None:
        self._committed = total
        sink = self._sink
        sink._local[(self._job, self._subtask)] = total
        if sink.path is None:
            return
        fs, root = get_fs(sink.path, sink.storage_options)
        jdir = join(root, self._job)
        fs.makedirs(jdir, exist_ok=True)
        final = join(jdir, f"count-{self._subtask}.json")
        tmp = join(jdir, f".count-{self._subtask}.json.tmp")
        with fs.open(tmp, "wb") as f:
            f.write(json.dumps({"subtask": self._subtask, "records": total}).encode())
        fs.mv(tmp, final)

    def _drop_replaced_subtasks(self) -> None:
        """After a scale-down, old subtasks ``s >= parallelism`` with ``s % parallelism ==
        subtask`` live on in this one: their counts are in this subtask's total now."""
        sink = self._sink
        replaced = [s for (j, s) in sink._local if j == self._job and s >= self._parallelism
                    and s % self._parallelism == self._subtask]
        for s in replaced:
            del sink._local[(self._job, s)]
        if sink.path is None:
            return
        fs, root = get_fs(sink.path, sink.storage_options)
        jdir = join(root, self._job)
        try:
            names = [f.rstrip("/").rsplit("/", 1)[-1] for f in fs.ls(jdir, detail=False)]
        except FileNotFoundError:
            return
        for name in names:
            number = name[len("count-"):-len(".json")] if name.startswith("count-") else ""
            if number.isdigit() and int(number) >= self._parallelism \
                    and int(number) % self._parallelism == self._subtask:
                rm_quiet(fs, join(jdir, name))
