"""Single-source shortest paths as an iteration in a Pipeline (Bellman-Ford, asynchronous).

    cutline run examples/shortest_paths.py [--vertices N] [--degree D] [--engine threads]
    python examples/shortest_paths.py [same options]

A distance offer ``(vertex, distance)`` enters a loop keyed by vertex.  The keyed state holds
each vertex's best distance; an offer that improves it is passed on to the vertex's
neighbours (one offer per edge) and fed back into the loop.  The loop empties when no offer
improves anything, which the job detects on a consistent checkpoint, and then it ends.  The
sink receives every improvement; the last per vertex is its distance, checked against
Dijkstra's algorithm.  Checkpoints log the offers on the feedback edge (the ABS paper's
scheme), so a ``--kill`` in the middle of the loop loses and doubles nothing.
"""

from __future__ import annotations

import heapq
import random
import shutil
import sys
import tempfile

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource


def make_graph(vertices: int, degree: int, seed: int) -> dict[int, list[tuple[int, int]]]:
    rng = random.Random(seed)
    graph = {v: [] for v in range(vertices)}
    for v in range(vertices):
        graph[v].append(((v + 1) % vertices, rng.randint(5, 50)))  # a ring: all reachable
        for _ in range(degree - 1):
            graph[v].append((rng.randrange(vertices), rng.randint(1, 100)))
    return graph


def dijkstra(graph: dict, source: int = 0) -> dict[int, int]:
    dist, todo = {source: 0}, [(0, source)]
    while todo:
        d, v = heapq.heappop(todo)
        if d > dist[v]:
            continue
        for w, c in graph[v]:
            if d + c < dist.get(w, 1 << 62):
                dist[w] = d + c
                heapq.heappush(todo, (d + c, w))
    return dist


class Relax:
    """Keyed by vertex: keep the best distance, pass improvements on along every edge."""

    def __init__(self, graph: dict) -> None:
        self.graph = graph

    def __call__(self, ctx, offer):
        vertex, dist = offer
        best = ctx.value_state("best", None)
        if best.value is not None and best.value <= dist:
            return ()
        best.update(dist)
        out = [("improved", vertex, dist)]
        out += [("offer", w, dist + c) for w, c in self.graph[vertex]]
        return out


def build(vertices: int = 2_000, degree: int = 4, graph_seed: int = 1, parallelism: int = 2,
          interval: float = 0.5) -> Pipeline:
    """Shortest paths from vertex 0 over a random graph, as an iteration.

    vertices: vertices of the random graph
    degree: edges per vertex (one of them on a ring, so every vertex is reachable)
    graph_seed: the random graph's seed
    parallelism: subtasks per operator
    interval: seconds between checkpoints
    """
    graph = make_graph(vertices, degree, graph_seed)
    tmp = tempfile.mkdtemp(prefix="cutline-sssp-")
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/checkpoints")
    p = Pipeline("shortest-paths", parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(f"{tmp}/out")
    loop = (p.source(GeneratorSource(count=1, fn=lambda i: (0, 0)), uid="start")
              .iterate(uid="offers"))
    relaxed = loop.key_by(lambda o: o[0]).process(Relax(graph), uid="relax")
    loop.close_with(relaxed.filter(lambda r: r[0] == "offer", uid="offers-only")
                           .map(lambda r: (r[1], r[2]), uid="as-offer")
                           .key_by(lambda o: o[0]))
    (relaxed.filter(lambda r: r[0] == "improved", uid="improvements")
            .map(lambda r: (r[1], r[2]), uid="as-distance")
            .sink(sink, uid="distances"))

    def after_run(result) -> int:
        best: dict[int, int] = {}
        updates = 0
        for v, d in sink.results():
            updates += 1
            best[v] = min(d, best.get(v, d))
        want = dijkstra(graph)
        same = best == want
        print(f"{len(best):,} vertices reached with {updates:,} improvements over "
              f"{result.attempts} attempt(s) and {len(result.checkpoints)} checkpoints; "
              f"distances equal Dijkstra's: {'yes' if same else 'NO'}")
        shutil.rmtree(tmp, ignore_errors=True)  # checkpoints and output: checked, done
        return 0 if same else 1

    p.after_run = after_run
    return p


if __name__ == "__main__":
    from cutline.graph.cli import run_main

    sys.exit(run_main(build, sys.argv[1:]))
