"""Regenerate ``tests/data/checkpoint-v1/``: checkpoints written by cutline at commit be9b5d9
(task state format version 1, a msgpack map without a version field).

Run once, with the old code first on the path (done for the committed fixture)::

    git archive be9b5d9 src tests/pipelines.py | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src:/tmp/old/tests python tests/data/make_checkpoint_v1.py OUT

It runs ``pipelines.wordcount`` (3000 sentences, parallelism 2, aligned, rate-limited so
several checkpoints complete mid-run) and copies a mid-run checkpoint to ``OUT/chk-<id>`` (committed: ``checkpoint-v1/chk-3``).
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

from pipelines import wordcount

import cutline

RECORDS = 3000


def main(out: str) -> None:
    print("cutline from", cutline.__file__)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="cutline-v1-"))
    p, _ = wordcount(tmp, RECORDS, "aligned", rate=3000, interval=0.2)
    p.with_checkpoint(retained=100)
    p.run(engine="threads", timeout=120)
    root = tmp / "checkpoints" / "wordcount"
    done = sorted(int(d.name[4:]) for d in root.iterdir()
                  if d.name.startswith("chk-") and (d / "_metadata").exists())
    mid = done[len(done) // 2]
    dest = pathlib.Path(out) / f"chk-{mid}"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(root / f"chk-{mid}", dest)
    print("checkpoints", done, "kept", dest)


if __name__ == "__main__":
    main(sys.argv[1])
