"""Space-time diagrams: files are written, text stays text in SVG, pairing is right."""

import pytest

from cutline.sim.diagram import _plan, draw
from cutline.sim.scenarios import lecture

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run():
    return lecture.run()


def test_lecture_png(run, tmp_path):
    out = draw(run.sim, tmp_path / "l.png", title="the lecture example")
    assert out == tmp_path / "l.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 10_000


def test_lecture_svg_keeps_text(run, tmp_path):
    out = draw(run.sim, tmp_path / "sub" / "dir" / "l.svg")  # parents are created
    text = out.read_text()
    assert "<svg" in text
    for name in ("P1", "P2", "P3", *"ABCDFGHIJ", "snapshot 1", "in transit (recorded)"):
        assert f">{name}<" in text, name


def test_svg_is_deterministic(run, tmp_path):
    a = draw(run.sim, tmp_path / "a.svg").read_text()
    b = draw(run.sim, tmp_path / "b.svg").read_text()
    assert a == b


@pytest.mark.parametrize("name", ["l.pdf", "l.jpg", "l"])
def test_bad_suffix(run, tmp_path, name):
    suffix = name[1:]
    with pytest.raises(ValueError, match=rf"'\{suffix}'" if suffix else "without suffix"):
        draw(run.sim, tmp_path / name)
    assert not (tmp_path / name).exists()


def test_no_pyplot_state(run, tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    draw(run.sim, tmp_path / "l.png")
    assert plt.get_fignums() == before


def test_lecture_plan(run):
    plan = _plan(run.sim)
    assert plan.procs == ["P1", "P2", "P3"]
    msgs = {(a.src, a.t0, a.dst, a.t1): a.recorded for a in plan.messages}
    assert msgs == {
        ("P3", 1.5, "P2", 3.5): False,  # I -> F
        ("P1", 2.0, "P2", 5.0): False,  # B -> G
        ("P2", 6.0, "P1", 7.5): True,  # H -> D crosses the cut, recorded on P2->P1
    }
    markers = {(a.src, a.t0, a.dst, a.t1) for a in plan.markers}
    assert len(markers) == 6 == len(run.sim.chans)
    assert ("P1", 2.5, "P2", 8.5) in markers
    assert ("P3", 3.5, "P2", 7.0) in markers
    assert plan.cuts == [(1, [("P1", 2.5), ("P2", 7.0), ("P3", 3.5)])]
    assert [ev.label for ev in plan.events] == list("AIBFGCHDJ")


def test_window_and_cap(run, tmp_path):
    plan = _plan(run.sim, window=(4.0, 7.0), max_messages=1)
    assert plan.xlim == (4.0, 7.0)
    assert [ev.label for ev in plan.events] == list("GCH")
    # B->G crosses into the window and is the earliest; H->D is recorded, so kept too.
    assert [(a.t0, a.t1, a.recorded) for a in plan.messages] == [(2.0, 5.0, False),
                                                                  (6.0, 7.5, True)]
    assert plan.messages_total == 2  # I->F ends before the window
    assert len(plan.markers) == 1 and plan.markers_total == 5  # P1->P3 ends at 3.5
    assert plan.cuts == [(1, [("P1", 2.5), ("P2", 7.0), ("P3", 3.5)])]  # clipped, not cut
    draw(run.sim, tmp_path / "w.png", window=(4.0, 7.0), max_messages=1)
    with pytest.raises(ValueError, match="t0 < t1"):
        draw(run.sim, tmp_path / "w.png", window=(7.0, 4.0))


def test_snapshot_choice(run, tmp_path):
    assert _plan(run.sim, snapshot_ids=[]).cuts == []
    assert not any(a.recorded for a in _plan(run.sim, snapshot_ids=[]).messages)
    with pytest.raises(ValueError, match="no snapshot 7"):
        draw(run.sim, tmp_path / "x.png", snapshot_ids=[7])


def test_reinjected_message_starts_at_left_edge(run, tmp_path):
    sim = lecture.build()
    sim.restore(run.snapshot)  # H is re-injected on P2->P1 and received at time 0
    sim.run()
    plan = _plan(sim)
    edge = [a for a in plan.messages if a.t0 is None]
    assert [(a.src, a.dst, a.t1) for a in edge] == [("P2", "P1", 0.0)]
    assert plan.xlim[0] < 0.0
    assert draw(sim, tmp_path / "r.png").read_bytes().startswith(PNG_MAGIC)


# ---------------------------------------------------------------- pictures users draw (issue 17)


def _arrow_ends(sim, plan):
    from cutline.sim.diagram import _segment

    y = {p: i for i, p in enumerate(plan.procs)}
    x0, x1 = plan.xlim
    return [_segment(a, x0, x1, y[a.src], y[a.dst]) for a in plan.messages + plan.markers]


def test_tokens_picture_draws_every_snapshot_with_arrows_inside():
    from cutline.cli import tokens_picture
    from cutline.sim.scenarios import tokens

    sim = tokens.run().sim
    kw = tokens_picture(sim)
    plan = _plan(sim, **kw)
    assert [n for n, _ in plan.cuts] == [s.id for s in sim.completed] and len(plan.cuts) == 8
    assert all(pts for _, pts in plan.cuts), "a snapshot drawn without its cut"
    x0, x1 = plan.xlim
    for xa, _, xb, _, _ in _arrow_ends(sim, plan):
        assert x0 <= xa <= x1 and x0 <= xb <= x1
    cut_times = [t for _, pts in plan.cuts for _, t in pts]
    assert max(cut_times) < x1 and min(cut_times) > x0
    recorded = [a for a in plan.messages if a.recorded]
    assert recorded and all(a.t1 is not None and a.t1 <= x1 for a in recorded)


def test_termination_labels_do_not_overlap(tmp_path):
    from cutline.sim.diagram import _figure
    from cutline.sim.scenarios import termination

    r = termination.run()
    plan = _plan(r.sim, snapshot_ids=[p.id for p in r.probes if p.detected])
    fig = _figure(plan, "termination")
    fig.draw_without_rendering()
    boxes = [t.get_window_extent() for t in fig.axes[0].texts if t.get_text() == "work"]
    assert len(boxes) >= 20
    overlapping = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert not overlapping, f"{len(overlapping)} overlapping labels"


def test_lecture_labels_all_drawn(run):
    from cutline.sim.diagram import _figure

    fig = _figure(_plan(run.sim), None)
    assert sorted(t.get_text() for t in fig.axes[0].texts) == list("ABCDFGHIJ")


def test_the_bank_diagram_gives_the_cut_its_width(tmp_path):
    from cutline.graph.pictures import _cut_window
    from graph_programs import ledger_graph

    result = ledger_graph(6, 200, 0.001).run(engine="threads", tasks=2, trace=True,
                                             snapshot_interval=0.05, timeout=60)
    snap = result.showcase()
    w0, w1 = _cut_window(result.trace, snap)
    # the cut and its markers take the middle 3/5 of the picture (it was ~3%)
    times = [*snap.taken_at.values(), *(ev.time for ev in result.trace if ev.checkpoint ==
                                        snap.id and ev.kind.startswith("marker"))]
    lo, hi = min(times), max(times)
    assert w0 <= lo and hi <= w1
    assert (hi - lo) / (w1 - w0) >= 0.5 or hi - lo < 3e-3, (lo, hi, w0, w1)
    out = result.diagram(tmp_path / "bank.png")
    assert out.read_bytes().startswith(PNG_MAGIC)
