"""Reading a checkpoint's keyed state as data: ``cutline.state.read`` and
``cutline checkpoints show|list``."""

from __future__ import annotations

import collections
import json

import pytest

import cutline.state
from cutline import CheckpointConfig, Pipeline
from cutline.cli import main
from cutline.connectors import CollectSink, GeneratorSource
from cutline.storage.checkpoints import CheckpointStorage

from pipelines import sentence, wordcount

N = 3_000


def _tally(ctx, word):
    seen = ctx.value_state("seen", 0)
    seen.update(seen.value + 1)
    ctx.list_state("lengths").append(len(word))
    return ((word, seen.value),)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("state-read")
    p, _ = wordcount(tmp, N, "aligned", interval=0.3)
    p.run(engine="threads", timeout=60)
    return CheckpointStorage(p.checkpoint.storage, p.name).latest().path


def test_read_gives_one_row_per_key_with_its_count(spark, finished):
    df = cutline.state.read(spark, finished, "count")
    rows = {r["key"]: r for r in df.collect()}
    want = collections.Counter(w for i in range(N) for w in sentence(i).split())
    assert {k: r["count"] for k, r in rows.items()} == dict(want)
    assert dict(df.dtypes) == {"key": "string", "key_group": "int", "count": "bigint"}
    assert all(0 <= r["key_group"] < 128 for r in rows.values())


def test_read_process_state_value_and_list(spark, tmp_path):
    cfg = CheckpointConfig(interval=0.3, storage=f"file://{tmp_path}/ck")
    p = Pipeline("tally", parallelism=2, checkpoint=cfg)
    (p.source(GeneratorSource(count=500, fn=lambda i: f"w{i % 9}" * (1 + i % 3)), uid="src")
       .key_by(lambda w: w).process(_tally, uid="tally")
       .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    p.run(engine="threads", timeout=60)
    path = CheckpointStorage(p.checkpoint.storage, p.name).latest().path
    df = cutline.state.read(spark, path, "tally")
    assert dict(df.dtypes)["lengths"] == "array<bigint>"
    got = {r["key"]: (r["seen"], r["lengths"]) for r in df.collect()}
    words = [f"w{i % 9}" * (1 + i % 3) for i in range(500)]
    want = collections.Counter(words)
    assert {k: v[0] for k, v in got.items()} == dict(want)
    assert all(v[1] == [len(k)] * v[0] for k, v in got.items())


def test_read_an_unknown_operator_names_the_ones_there(spark, finished):
    with pytest.raises(KeyError, match=r"no keyed state of operator 'nope'.*\['count'\]"):
        cutline.state.read(spark, finished, "nope")


def test_cli_show_lists_operators_sizes_and_keys(finished, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["checkpoints", "show", finished, "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    ops = {o["uid"]: o for o in info["operators"]}
    assert set(ops) == {"sentences", "split", "count", "out"}
    assert ops["count"]["keys"] == len({w for i in range(N) for w in sentence(i).split()})
    assert ops["count"]["kind"] == "count" and ops["count"]["tasks"] == 2
    assert ops["sentences"]["source"] is True
    assert main(["checkpoints", "show", finished]) == 0
    out = capsys.readouterr().out
    assert "count" in out and "sentences" in out


def test_cli_show_a_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["checkpoints", "show", str(tmp_path / "chk-9")]) == 1
    assert "no completed checkpoint" in capsys.readouterr().err


def test_cli_list(finished, capsys):
    storage = finished.rsplit("/", 2)[0]
    assert main(["checkpoints", "list", storage, "wordcount", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and rows[-1]["path"] == finished


def test_read_a_rocksdb_checkpoint(spark, tmp_path):
    p, _ = wordcount(tmp_path, N, "aligned", interval=0.3)
    p.with_checkpoint(state_backend="rocksdb")
    p.run(engine="threads", timeout=60)
    path = CheckpointStorage(p.checkpoint.storage, p.name).latest().path
    rows = {r["key"]: r["count"] for r in cutline.state.read(spark, path, "count").collect()}
    assert rows == dict(collections.Counter(w for i in range(N) for w in sentence(i).split()))
