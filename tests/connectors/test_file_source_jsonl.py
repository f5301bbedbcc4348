"""FileSource's jsonl path reads a block at a time and hands slices of lines to msgspec's
decoder (lines it refuses to json's C scanner): records, positions and errors must be
exactly what line-by-line ``json.loads`` gives."""

import json
import math
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline.connectors import FileSource, RecordError
from cutline.connectors import files

TRICKY = [
    {"id": 0, "s": "plain"},
    {"id": 1, "s": "caf\u00e9 \u2603 \U0001f600", "esc": "a\\nb\"c"},
    {"id": 2, "big": 12345678901234567890123, "f": 1e-300, "neg": -0.0},
    {"id": 3, "nested": {"a": [1, {"b": None}], "t": True, "f": False}},
    {"id": 4, "nan": float("nan"), "inf": float("inf")},
]


def opened(src, subtask=0, parallelism=1):
    r = src.create_reader()
    r.open(subtask, parallelism)
    return r


def drain(r, size=3):
    out = []
    while (batch := r.read_batch(size)) is not None:
        out.extend(batch)
    return out


def roundtrip(state):
    return pickle.loads(pickle.dumps(state))


def same(a, b):
    """Equal, with NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


def awkward_file(path):
    """Blank and whitespace-only lines, CRLF, leading/trailing spaces, no final newline."""
    lines = [json.dumps(r) for r in TRICKY]
    text = (lines[0] + "\n\n   \n" + "  " + lines[1] + "  \n" + lines[2] + "\r\n"
            + "\t\n" + lines[3] + "\n" + lines[4])  # no newline at the end
    path.write_bytes(text.encode("utf-8"))
    return text


@pytest.fixture(params=[1, 5, 64, 1 << 20], ids=lambda b: f"block{b}")
def block(request, monkeypatch):
    monkeypatch.setattr(files, "_BLOCK", request.param, raising=False)
    return request.param


def test_awkward_lines_parse_like_json_loads(tmp_path, block):
    text = awkward_file(tmp_path / "a.jsonl")
    expected = [json.loads(t) for t in text.split("\n") if t.strip()]
    got = drain(opened(FileSource(str(tmp_path))), size=2)
    assert same(got, expected) and len(got) == len(TRICKY)


def test_restore_at_every_record_continues_exactly(tmp_path, block):
    text = awkward_file(tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"id": i}) + "\n"
                                              for i in range(10, 17)))
    src = FileSource(str(tmp_path))
    everything = drain(opened(src))
    assert len(everything) == len(TRICKY) + 7
    for cut in range(len(everything) + 1):
        r = opened(src)
        prefix = []
        while len(prefix) < cut:
            prefix.extend(r.read_batch(min(2, cut - len(prefix))))
        state = roundtrip(r.snapshot())
        if state["file"] == "a.jsonl":  # the offset is where the next record's line starts
            data = text.encode()
            assert 0 < state["offset"] <= len(data)
            newlines = data[:state["offset"]].count(b"\n")
            assert state["line"] == newlines + (state["offset"] == len(data))
        fresh = opened(src)
        fresh.restore(state)
        assert same(prefix + drain(fresh), everything), (cut, state)


def test_offset_after_the_last_line_is_the_file_size(tmp_path, block):
    awkward_file(tmp_path / "a.jsonl")
    r = opened(FileSource(str(tmp_path)))
    assert len(r.read_batch(len(TRICKY))) == len(TRICKY)
    state = r.snapshot()
    assert state["file"] in (None, "a.jsonl")
    if state["file"] is not None:
        assert state["offset"] == (tmp_path / "a.jsonl").stat().st_size
    assert r.read_batch(10) is None


def test_malformed_line_after_a_block_boundary(tmp_path, block):
    good = "".join(json.dumps({"id": i, "pad": "x" * i}) + "\n" for i in range(6))
    (tmp_path / "bad.jsonl").write_text(good + "\n" + '{"id": 6,,}\n{"id": 7}\n')
    r = opened(FileSource(str(tmp_path)))
    assert [x["id"] for x in r.read_batch(6)] == list(range(6))
    for _ in range(2):  # a retry fails the same way: the position stays at the bad record
        with pytest.raises(RecordError) as err:
            r.read_batch(5)
        e = err.value
        assert e.line == 8 and e.position == len(good) + 1, (e.line, e.position)
        assert "Expecting" in e.reason
        assert r.snapshot()["offset"] == len(good) + 1 and r.snapshot()["line"] == 7


def test_invalid_utf8_is_a_record_error(tmp_path, block):
    (tmp_path / "x.jsonl").write_bytes(b'{"id": 1}\n{"id": "\xff"}\n')
    r = opened(FileSource(str(tmp_path)))
    with pytest.raises(RecordError, match=r"x\.jsonl \(line 2, byte offset 10\)"):
        drain(r)


def test_other_encodings_are_decoded_per_line(tmp_path, block):
    recs = [{"id": i, "s": "\u00e9t\u00e9 \u00e0 " + str(i)} for i in range(5)]
    (tmp_path / "l.jsonl").write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\n"
                                               for r in recs).encode("latin-1"))
    assert drain(opened(FileSource(str(tmp_path), encoding="latin-1"))) == recs


# JSON values of every kind json.dumps writes: big integers beyond 64 bits, floats at the
# edges of their range, escapes, astral characters, lone surrogates, NaN and infinities
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**130), max_value=2**130)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_json_values, min_size=1, max_size=30),
       blanks=st.lists(st.integers(min_value=0, max_value=30), max_size=3),
       size=st.integers(min_value=1, max_value=40))
def test_the_fast_decoder_gives_what_json_loads_gives(tmp_path_factory, values, blanks, size):
    """msgspec decodes slices of lines; a slice it refuses goes line by line through json:
    either way every record is exactly ``json.loads``' (type included: a 2**100 stays an
    int), and a restore at any position continues exactly."""
    d = tmp_path_factory.mktemp("fast")
    lines = [json.dumps(v) for v in values]
    for b in blanks:
        lines.insert(min(b, len(lines)), "   ")
    (d / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = [json.loads(t) for t in lines if t.strip()]
    r = opened(FileSource(str(d)))
    got = []
    while (batch := r.read_batch(size)) is not None:
        got.extend(batch)
        if len(got) * 2 >= len(expected) > len(got) - len(batch):  # restore mid-way once
            state = roundtrip(r.snapshot())
            r = opened(FileSource(str(d)))
            r.restore(state)
    assert same(got, expected), (got, expected)


def test_a_directory_of_links_to_files_is_read(tmp_path):
    """A symbolic link to a file is an input file (fsspec's local listing types it "other":
    such a directory read nothing, silently); a link to a directory is not, as a
    directory is not; both sources, per record and batches."""
    data, inp = tmp_path / "data", tmp_path / "in"
    data.mkdir()
    inp.mkdir()
    (data / "sub").mkdir()
    for k in range(3):
        (data / f"part-{k}.jsonl").write_text(
            "".join(json.dumps({"k": k, "i": i}) + "\n" for i in range(4)))
        (inp / f"part-{k}.jsonl").symlink_to(data / f"part-{k}.jsonl")
    (inp / "dir").symlink_to(data / "sub")
    want = sorted((k, i) for k in range(3) for i in range(4))
    src = FileSource(str(inp))
    assert src.check() is None
    got = [r for p in range(2) for r in drain(opened(src, p, 2))]
    assert sorted((r["k"], r["i"]) for r in got) == want
    import pyarrow as pa

    batches = FileSource(str(inp)).batches(pa.schema([("k", pa.int64()), ("i", pa.int64())]))
    rows = [row for p in range(2) for b in drain(opened(batches, p, 2)) for row in b.to_pylist()]
    assert sorted((r["k"], r["i"]) for r in rows) == want
