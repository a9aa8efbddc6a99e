"""A layered (Sugiyama-style) layout of a directed acyclic graph, small enough to read.

Ranks come from the longest path, an edge spanning several ranks passes through one dummy
point per rank it crosses (so it bends around boxes instead of through them), the order
within each rank is improved by a few barycenter sweeps, and each node then moves toward its
neighbours' mean x as far as the order and the gaps allow. It aims at pictures a person can
follow, not at minimal crossings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: horizontal gap between neighbours in a rank, vertical gap between ranks, dummy width
GAP_X, GAP_Y, DUMMY_WIDTH = 24.0, 34.0, 10.0
SWEEPS = 6


@dataclass
class Placed:
    """A node's box (top-left corner and size); dummies are the bends of long edges."""

    key: str
    width: float
    height: float
    rank: int = 0
    x: float = 0.0
    y: float = 0.0
    dummy: bool = False

    @property
    def center(self) -> float:
        return self.x + self.width / 2


@dataclass
class Layout:
    nodes: dict[str, Placed]
    #: for each edge (source, target), the points its line passes through, top to bottom
    routes: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    width: float = 0.0
    height: float = 0.0


def layout(sizes: dict[str, tuple[float, float]], edges: list[tuple[str, str]]) -> Layout:
    """Place nodes (`sizes` in topological order: every edge goes from an earlier key to a later
    one) in ranks top to bottom and route every edge."""
    nodes = {k: Placed(k, w, h) for k, (w, h) in sizes.items()}
    preds: dict[str, list[str]] = {k: [] for k in nodes}
    for a, b in edges:
        preds[b].append(a)
    for k in nodes:
        nodes[k].rank = max((nodes[p].rank + 1 for p in preds[k]), default=0)
    chains = {e: _dummy_chain(e, nodes) for e in dict.fromkeys(edges)}
    ranks = _ranks(nodes)
    links = [(a, b) for chain in chains.values() for a, b in zip(chain, chain[1:])]
    up: dict[str, list[str]] = {k: [] for k in nodes}
    down: dict[str, list[str]] = {k: [] for k in nodes}
    for a, b in links:
        down[a].append(b)
        up[b].append(a)
    _order(ranks, up, down)
    _place_x(ranks, nodes, up, down)
    height = _place_y(ranks, nodes)
    out = Layout(nodes, width=max((n.x + n.width for n in nodes.values()), default=0.0), height=height)
    out.routes = {e: _route(chain, nodes) for e, chain in chains.items()}
    return out


def _dummy_chain(edge: tuple[str, str], nodes: dict[str, Placed]) -> list[str]:
    a, b = edge
    chain = [a]
    for r in range(nodes[a].rank + 1, nodes[b].rank):
        key = f"{a}->{b}#{r}"
        nodes[key] = Placed(key, DUMMY_WIDTH, 0.0, r, dummy=True)
        chain.append(key)
    return chain + [b]


def _ranks(nodes: dict[str, Placed]) -> list[list[str]]:
    ranks: list[list[str]] = [[] for _ in range(1 + max((n.rank for n in nodes.values()), default=0))]
    for k, n in nodes.items():
        ranks[n.rank].append(k)
    return ranks


def _order(ranks: list[list[str]], up: dict[str, list[str]], down: dict[str, list[str]]) -> None:
    """Barycenter sweeps, alternately down (order by the mean position of the predecessors)
    and up (of the successors); a node without neighbours on that side keeps its place."""
    for sweep in range(SWEEPS):
        going_down = sweep % 2 == 0
        seq = range(1, len(ranks)) if going_down else range(len(ranks) - 2, -1, -1)
        for r in seq:
            side = up if going_down else down
            pos = {k: i for i, k in enumerate(ranks[r - 1 if going_down else r + 1])}
            old = {k: i for i, k in enumerate(ranks[r])}

            def key(k: str) -> float:
                near = [pos[n] for n in side[k] if n in pos]
                return sum(near) / len(near) if near else float(old[k])

            ranks[r].sort(key=lambda k: (key(k), old[k]))


def _place_x(ranks: list[list[str]], nodes: dict[str, Placed], up: dict[str, list[str]],
             down: dict[str, list[str]]) -> None:
    """Pack each rank left to right, then let nodes drift toward their neighbours' centers,
    never closer than GAP_X to the next node of their rank."""
    for rank in ranks:
        x = 0.0
        for k in rank:
            nodes[k].x, x = x, x + nodes[k].width + GAP_X
    for sweep in range(2 * SWEEPS):
        seq = ranks if sweep % 2 == 0 else ranks[::-1]
        side = up if sweep % 2 == 0 else down
        for rank in seq:
            want = {}
            for k in rank:
                near = [nodes[n].center for n in side[k]]
                want[k] = (sum(near) / len(near) - nodes[k].width / 2) if near else nodes[k].x
            _settle(rank, nodes, want)
    left = min((n.x for n in nodes.values()), default=0.0)
    for n in nodes.values():
        n.x -= left


def _settle(rank: list[str], nodes: dict[str, Placed], want: dict[str, float]) -> None:
    """Move a rank's nodes toward `want` keeping their order and gaps: the mean of a
    left-to-right pass (pushing overlapping nodes right) and a right-to-left one (pushing them
    left), so a crowd of nodes that want one place spreads to both sides of it."""
    right: dict[str, float] = {}
    edge = float("-inf")
    for k in rank:
        right[k] = max(want[k], edge)
        edge = right[k] + nodes[k].width + GAP_X
    edge = float("inf")
    for k in reversed(rank):
        left = min(want[k], edge - nodes[k].width - GAP_X)
        nodes[k].x, edge = (left + right[k]) / 2, left


def _place_y(ranks: list[list[str]], nodes: dict[str, Placed]) -> float:
    y = 0.0
    for rank in ranks:
        tall = max((nodes[k].height for k in rank), default=0.0)
        for k in rank:
            nodes[k].y = y + (tall - nodes[k].height) / 2
        y += tall + GAP_Y
    return y - GAP_Y


def _route(chain: list[str], nodes: dict[str, Placed]) -> list[tuple[float, float]]:
    """Bottom center of the source, each dummy's center, top center of the target."""
    first, last = nodes[chain[0]], nodes[chain[-1]]
    points = [(first.center, first.y + first.height)]
    points += [(nodes[k].center, nodes[k].y) for k in chain[1:-1]]
    return points + [(last.center, last.y)]
