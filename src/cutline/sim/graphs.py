"""Random process graphs for scenarios and property tests (seeded, deterministic)."""

from __future__ import annotations

import random


def strongly_connected(n: int, rng: random.Random, extra: float = 0.3) -> list[tuple[int, int]]:
    """A random strongly connected digraph on ``0..n-1``: a shuffled ring plus chords."""
    if n < 1:
        raise ValueError(f"a graph needs at least one process, got {n}")
    order = list(range(n))
    rng.shuffle(order)
    edges = {(order[i], order[(i + 1) % n]) for i in range(n)} if n > 1 else set()
    for a in range(n):
        for b in range(n):
            if a != b and rng.random() < extra:
                edges.add((a, b))
    return sorted(edges)


def random_dag(
    layers: list[int], rng: random.Random, density: float = 0.6
) -> list[tuple[int, int]]:
    """A layered DAG; every node in layer k>0 has at least one input from layer k-1."""
    ids, nodes = 0, []
    for width in layers:
        nodes.append(list(range(ids, ids + width)))
        ids += width
    edges = set()
    for k in range(1, len(nodes)):
        for b in nodes[k]:
            edges.add((rng.choice(nodes[k - 1]), b))
            for a in nodes[k - 1]:
                if rng.random() < density:
                    edges.add((a, b))
        for a in nodes[k - 1]:  # every node feeds the next layer
            if not any(e[0] == a for e in edges):
                edges.add((a, rng.choice(nodes[k])))
    return sorted(edges)
