"""The eight collectives: what each does to every rank's data, simulated, run and drawn.

Every collective is described on "slots": rank r's buffer is world_size chunks of k elements,
and None marks a slot with no data (or, after a reduce, undefined data):

    broadcast       the root's buffer is copied to every rank
    scatter         the root's chunk j goes to rank j (landing at slot j)
    gather          rank j's chunk (at slot j) goes to the root, which holds all of them
    all_gather      every rank ends with every rank's chunk
    reduce          the root gets the elementwise sum; other ranks' buffers become undefined
    all_reduce      every rank gets the elementwise sum
    reduce_scatter  rank j gets the sum of chunk j (at slot j)
    all_to_all      rank r's chunk j goes to rank j, landing at slot r (a transpose)

Placing outputs at slot j is the in-place layout of NCCL: an all_gather writes rank j's chunk at
offset j*k of one output buffer. `simulate` follows these rules in pure Python; `real_states`
runs the real torch.distributed calls, and the tests hold the two equal.

All-reduce built by hand from send/recv (ring and tree) lives in allreduce.py.
Taught in: lessons/04_distributed_fundamentals.ipynb
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gpulab.distributed.allreduce import ring_chunks

COLLECTIVES = ("broadcast", "scatter", "gather", "all_gather", "reduce", "all_reduce",
               "reduce_scatter", "all_to_all")


class Piece(frozenset):
    """Symbolic data: the set of (rank, slot) inputs summed into one element. a0 + b0 = {a0, b0}."""

    def __add__(self, other: Piece) -> Piece:
        return Piece(self | other)

    def label(self, world_size: int) -> str:
        """'b2' for rank 1's slot 2, 'a0+c0' for a partial sum, 'Σ0' for the sum over all ranks."""
        slots = {s for _, s in self}
        if len(self) == world_size > 2 and len(slots) == 1:
            return f"Σ{slots.pop()}"
        return "+".join(f"{'abcdefgh'[r]}{s}" for r, s in sorted(self))


def initial_slots(name: str, world_size: int, root: int = 0) -> list[list]:
    """Each rank's buffer before `name`, as Pieces: rank r's slot j holds {(r, j)}."""
    full = [[Piece({(r, j)}) for j in range(world_size)] for r in range(world_size)]
    if name in ("broadcast", "scatter"):  # only the root has data
        return [row if r == root else [None] * world_size for r, row in enumerate(full)]
    if name in ("gather", "all_gather"):  # each rank contributes one chunk, at its own slot
        return [[x if j == r else None for j, x in enumerate(row)] for r, row in enumerate(full)]
    return full


def simulate(name: str, before: list[list], root: int = 0) -> list[list]:
    """Each rank's slots after the collective `name`, following its semantics (module doc).

    before[r] holds world_size * k slots for rank r (numbers or Pieces; None = empty)."""
    p = len(before)
    k = len(before[0]) // p

    def chunk(row, j):
        return row[j * k:(j + 1) * k]

    def summed(rows):
        out = list(rows[0])
        for row in rows[1:]:
            out = [a + b for a, b in zip(out, row, strict=True)]
        return out

    def at_slot(values, j):  # a k-element output placed at slot j of an otherwise empty buffer
        return [None] * (j * k) + list(values) + [None] * ((p - j - 1) * k)

    if name == "broadcast":
        return [list(before[root]) for _ in range(p)]
    if name == "scatter":
        return [at_slot(chunk(before[root], r), r) for r in range(p)]
    if name in ("gather", "all_gather"):
        everything = [x for r in range(p) for x in chunk(before[r], r)]
        return [everything if name == "all_gather" or r == root else list(before[r])
                for r in range(p)]
    if name in ("reduce", "all_reduce"):
        total = summed(before)
        return [list(total) if name == "all_reduce" or r == root else [None] * (p * k)
                for r in range(p)]
    if name == "reduce_scatter":
        total = summed(before)
        return [at_slot(chunk(total, r), r) for r in range(p)]
    if name == "all_to_all":
        return [[x for j in range(p) for x in chunk(before[j], r)] for r in range(p)]
    raise ValueError(f"unknown collective {name!r}; choose one of {', '.join(COLLECTIVES)}")


def run_collective(name: str, row: list, root: int = 0) -> list:
    """On this rank, the real torch.distributed call for `name` on a buffer given as slots
    (floats; None = empty); returns this rank's slots after it, in the layout of `simulate`."""
    p, rank = dist.get_world_size(), dist.get_rank()
    k = len(row) // p
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    x = torch.tensor([0.0 if v is None else v for v in row], dtype=torch.float64, device=device)
    chunks = list(x.split(k))
    mine = chunks[rank].clone()

    def at_slot(t, j):
        return [None] * (j * k) + t.tolist() + [None] * ((p - j - 1) * k)

    if name == "broadcast":
        dist.broadcast(x, src=root)
    elif name == "scatter":
        dist.scatter(mine, chunks if rank == root else None, src=root)
        return at_slot(mine, rank)
    elif name == "gather":
        out = [torch.empty_like(mine) for _ in range(p)] if rank == root else None
        dist.gather(mine, out, dst=root)
        return torch.cat(out).tolist() if rank == root else list(row)
    elif name == "all_gather":
        out = [torch.empty_like(mine) for _ in range(p)]
        dist.all_gather(out, mine)
        return torch.cat(out).tolist()
    elif name == "reduce":
        dist.reduce(x, dst=root)
        return x.tolist() if rank == root else [None] * len(row)  # undefined off the root
    elif name == "all_reduce":
        dist.all_reduce(x)
    elif name == "reduce_scatter":
        dist.reduce_scatter(mine, chunks)
        return at_slot(mine, rank)
    elif name == "all_to_all":
        out = [torch.empty_like(mine) for _ in range(p)]
        all_to_all(out, chunks)
        return torch.cat(out).tolist()
    else:
        raise ValueError(f"unknown collective {name!r}; choose one of {', '.join(COLLECTIVES)}")
    return x.tolist()


def all_to_all(out: list, chunks: list) -> None:
    """dist.all_to_all(out, chunks). gloo gained all-to-all only in recent torch releases;
    where it lacks it, the same exchange is p scatters, one rooted at each rank: rank j's
    chunk r lands in rank r's out[j] either way."""
    try:
        dist.all_to_all(out, chunks)
    except RuntimeError as error:
        if "does not support alltoall" not in str(error):
            raise
        rank = dist.get_rank()
        for src in range(dist.get_world_size()):
            dist.scatter(out[src], chunks if rank == src else None, src=src)


def _bit(rank: int, slot: int, world_size: int) -> float:
    return 2.0 ** (rank * world_size + slot)  # a sum of distinct powers of two is the set itself


def _decode(value, world_size: int):
    if value is None:
        return None
    bits = int(value)
    return Piece({divmod(b, world_size) for b in range(world_size ** 2) if bits >> b & 1})


def _states_on_rank(rank, world_size, names, root):
    rows = {}
    for name in names:
        row = [None if x is None else sum(_bit(r, s, world_size) for r, s in x)
               for x in initial_slots(name, world_size, root)[rank]]
        rows[name] = run_collective(name, row, root)
    return rows


def real_states(names=COLLECTIVES, world_size: int = 4, root: int = 0) -> dict:
    """{name: (before, after)} as Pieces, from real gloo runs in one launch: each (rank, slot)
    input is sent as its own power of two, so every sum the collective makes decodes exactly."""
    from gpulab.distributed.runtime.launch import run_on_ranks

    if world_size ** 2 > 52:
        raise ValueError("real_states encodes world_size**2 bits in a float64: world_size <= 7")
    per_rank = run_on_ranks(_states_on_rank, world_size, list(names), root, backend="gloo")
    return {name: (initial_slots(name, world_size, root),
                   [[_decode(v, world_size) for v in per_rank[r][name]]
                    for r in range(world_size)])
            for name in names}


def collective_states(name: str, world_size: int = 4, root: int = 0, real: bool = False):
    """(before, after): each rank's slots as Pieces, simulated, or measured when real=True."""
    if real:
        return real_states([name], world_size, root)[name]
    before = initial_slots(name, world_size, root)
    return before, simulate(name, before, root)


def ring_steps(world_size: int) -> list[tuple[str, list[list]]]:
    """The ring all-reduce of `ring_all_reduce`, simulated on Pieces: (title, slots) per step."""
    p = world_size
    state = initial_slots("all_reduce", p)
    steps = [("before", [list(row) for row in state])]
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(p - 1):
            sent = [state[r][ring_chunks(r, step, p, phase)[0]] for r in range(p)]
            for r in range(p):
                incoming, j = sent[(r - 1) % p], ring_chunks(r, step, p, phase)[1]
                state[r][j] = state[r][j] + incoming if phase == "reduce-scatter" else incoming
            steps.append((f"{phase} step {step + 1}", [list(row) for row in state]))
    return steps




def draw_collective(name: str, world_size: int = 4, root: int = 0, real: bool = False):
    """Each rank's buffer before and after `name` (simulated, or from real runs when real=True)."""
    before, after = collective_states(name, world_size, root, real)
    where = f", root = rank {root}" if name in ("broadcast", "scatter", "gather", "reduce") else ""
    return draw_states([("before", before), (f"after {name}", after)],
                       f"{name}, {world_size} ranks{where}")


def draw_ring(world_size: int = 4):
    """Every step of ring_all_reduce: partial sums travel right until each rank has them all."""
    return draw_states(ring_steps(world_size), f"ring all-reduce, {world_size} ranks")


def draw_states(states, title: str = ""):
    """Panels of (title, slots): one row per rank, one cell per slot, coloured by the rank the
    data came from (sums in purple, empty slots blank). Returns a matplotlib Figure."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    from gpulab.viz import DPI

    p = len(states[0][1])
    cols = min(len(states), 4)
    rows = -(-len(states) // cols)
    fig = Figure(figsize=(cols * (0.75 * p + 0.9), rows * (0.42 * p + 0.8)), dpi=DPI)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    palette = ["#8ecae6", "#ffb703", "#90be6d", "#f28482", "#cdb4db", "#a3a380", "#84a59d",
               "#f6bd60"]
    for ax, (panel, slots) in zip(axes, states, strict=False):
        for r, row in enumerate(slots):
            for j, piece in enumerate(row):
                colour = ("white" if piece is None else palette[next(iter(piece))[0] % 8]
                          if len(piece) == 1 else "#b5a0d8" if len(piece) < p else "#7b5ea7")
                ax.add_patch(Rectangle((j, r), 0.94, 0.9, facecolor=colour, edgecolor="0.6",
                                       ls="-" if piece is not None else ":"))
                if piece is not None:
                    text = piece.label(p)
                    ax.text(j + 0.47, r + 0.45, text, ha="center", va="center",
                            fontsize=8 if len(text) < 6 else 6.5,
                            color="white" if colour == "#7b5ea7" else "black")
        ax.set_xlim(-0.05, len(slots[0]))
        ax.set_ylim(p, -0.1)
        ax.set_yticks([r + 0.45 for r in range(p)], [f"rank {r}" for r in range(p)], fontsize=8)
        ax.set_xticks([])
        ax.set_title(panel, fontsize=9)
        for side in ax.spines.values():
            side.set_visible(False)
    for ax in axes[len(states):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
