"""The (dp, pp, tp) rank grid: which ranks share a tensor-, pipeline- or data-parallel group.

    grid = RankGrid(dp_size=2, pp_size=2, tp_size=2)        # 8 ranks
    grid.coords(5)                  # GridCoords(dp_rank=0, pp_rank=1, tp_rank=1)
    grid.tp_group_ranks(5)          # [4, 5]     tensor parallel: neighbours, inside one node
    grid.dp_group_ranks(5)          # [5, 7]
    grid.pp_group_ranks(5)          # [1, 5]     stage 0 then stage 1
    groups = new_groups(grid)       # on every rank: this rank's torch process groups
    dist.all_reduce(x, group=groups.tp)

The layout is Megatron-LM's default, order "tp-cp-ep-dp-pp" (megatron/core/parallel_state.py,
`initialize_model_parallel`) with cp = ep = 1, that is tp fastest-varying, then dp, then pp:

    rank = tp_rank + tp_size * (dp_rank + dp_size * pp_rank)

Why this order: tensor parallelism all-reduces activations inside every layer, so its ranks must
be neighbours (one node, NVLink: 8 GPUs of a node hold whole TP groups when tp_size divides 8);
pipeline parallelism sends one activation per microbatch between stages, the least traffic,
so it takes the largest stride and is the axis that crosses nodes most. torchtitan builds the
same layout with a DeviceMesh whose dims are ("pp", ..., "dp", ..., "tp"): a mesh is
`arange(world_size).view(mesh_shape)`, row-major, so its LAST dim varies fastest. The mesh
equivalent of a RankGrid is therefore

    init_device_mesh(device_type, (pp_size, dp_size, tp_size), mesh_dim_names=("pp", "dp", "tp"))

which `device_mesh(grid)` calls; mesh["tp"].get_group() then holds the same ranks as
grid.tp_group_ranks(rank) (the tests check this on real gloo ranks).

The grid is a value, computed the same way on every rank from three numbers: no global state.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

AXES = ("tp", "dp", "pp")  # fastest-varying first: the order ranks are numbered in
_WHAT = {"tp": "tensor parallel", "dp": "data parallel", "pp": "pipeline parallel"}


class GridCoords(NamedTuple):
    """A rank's place in the grid: which data replica, which pipeline stage, which TP shard."""

    dp_rank: int
    pp_rank: int
    tp_rank: int


@dataclass(frozen=True)
class RankGrid:
    """world_size = dp_size * pp_size * tp_size ranks, laid out tp fastest, then dp, then pp."""

    dp_size: int  # model replicas, each fed its own share of the batch
    pp_size: int  # pipeline stages, each holding a contiguous slice of the layers
    tp_size: int  # shards of every layer's weight matrices

    def __post_init__(self):
        for axis in ("dp", "pp", "tp"):
            size = getattr(self, f"{axis}_size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"{axis}_size must be an int >= 1 (the number of "
                                 f"{_WHAT[axis]} ranks), got {size!r}")

    @classmethod
    def for_world(cls, world_size: int, pp_size: int = 1, tp_size: int = 1) -> RankGrid:
        """The grid with dp_size = world_size / (pp_size * tp_size), as Megatron-LM infers it."""
        model_parallel = pp_size * tp_size
        if world_size % model_parallel:
            raise ValueError(f"world_size={world_size} is not divisible by pp_size * tp_size = "
                             f"{pp_size} * {tp_size} = {model_parallel}: every data-parallel "
                             "replica needs a whole pipeline of tensor-parallel groups")
        return cls(world_size // model_parallel, pp_size, tp_size)

    @property
    def world_size(self) -> int:
        return self.dp_size * self.pp_size * self.tp_size

    def size(self, axis: str) -> int:
        """The size of one axis: "dp", "pp" or "tp"."""
        return getattr(self, f"{_check_axis(axis)}_size")

    def check_world_size(self, world_size: int) -> None:
        """Raise ValueError unless this grid has exactly world_size ranks."""
        if world_size != self.world_size:
            raise ValueError(
                f"dp_size * pp_size * tp_size = {self.dp_size} * {self.pp_size} * "
                f"{self.tp_size} = {self.world_size} ranks, but the world has {world_size}. "
                "Every rank must have a place in the grid: choose sizes whose product is the "
                f"world size (RankGrid.for_world({world_size}, pp_size, tp_size) infers dp_size).")

    def coords(self, rank: int) -> GridCoords:
        """(dp_rank, pp_rank, tp_rank) of a global rank."""
        self._check_rank(rank)
        tp_rank = rank % self.tp_size
        dp_rank = rank // self.tp_size % self.dp_size
        pp_rank = rank // (self.tp_size * self.dp_size)
        return GridCoords(dp_rank, pp_rank, tp_rank)

    def rank(self, dp_rank: int, pp_rank: int, tp_rank: int) -> int:
        """The global rank at these coordinates (the inverse of `coords`)."""
        for axis, value in (("dp", dp_rank), ("pp", pp_rank), ("tp", tp_rank)):
            if not 0 <= value < self.size(axis):
                raise ValueError(f"{axis}_rank={value} is outside 0..{self.size(axis) - 1} "
                                 f"({axis}_size={self.size(axis)})")
        return tp_rank + self.tp_size * (dp_rank + self.dp_size * pp_rank)

    def group_ranks(self, axis: str, rank: int) -> list[int]:
        """The ranks of `rank`'s group along `axis`, in the order of that axis' coordinate."""
        here = self.coords(rank)._asdict()
        ranks = []
        for i in range(self.size(axis)):
            here[f"{axis}_rank"] = i
            ranks.append(self.rank(**here))
        return ranks

    def tp_group_ranks(self, rank: int) -> list[int]:
        """Ranks holding the other shards of the same layers (contiguous ranks)."""
        return self.group_ranks("tp", rank)

    def dp_group_ranks(self, rank: int) -> list[int]:
        """Ranks holding the same shard of the same stage: they average gradients."""
        return self.group_ranks("dp", rank)

    def pp_group_ranks(self, rank: int) -> list[int]:
        """This rank's pipeline, first stage first."""
        return self.group_ranks("pp", rank)

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, ordered by their lowest rank: they partition the world."""
        _check_axis(axis)
        return [self.group_ranks(axis, r) for r in range(self.world_size)
                if self.coords(r)._asdict()[f"{axis}_rank"] == 0]

    def stage_of(self, rank: int) -> int:
        """The pipeline stage (pp_rank) of a rank."""
        return self.coords(rank).pp_rank

    def is_first_stage(self, rank: int) -> bool:
        return self.stage_of(rank) == 0

    def is_last_stage(self, rank: int) -> bool:
        return self.stage_of(rank) == self.pp_size - 1

    def next_stage_rank(self, rank: int, wrap: bool = False) -> int | None:
        """Where this rank sends activations: the same (dp, tp) place one stage later. None on
        the last stage, unless wrap=True (the interleaved schedule sends the last stage's output
        for chunk c to stage 0's chunk c+1)."""
        dp_rank, pp_rank, tp_rank = self.coords(rank)
        if pp_rank == self.pp_size - 1 and not wrap:
            return None
        return self.rank(dp_rank, (pp_rank + 1) % self.pp_size, tp_rank)

    def prev_stage_rank(self, rank: int, wrap: bool = False) -> int | None:
        """Where this rank receives activations from (and sends gradients to). None on the
        first stage, unless wrap=True."""
        dp_rank, pp_rank, tp_rank = self.coords(rank)
        if pp_rank == 0 and not wrap:
            return None
        return self.rank(dp_rank, (pp_rank - 1) % self.pp_size, tp_rank)

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        """The DeviceMesh shape with the same layout: slowest axis first, (pp, dp, tp)."""
        return (self.pp_size, self.dp_size, self.tp_size)

    @property
    def mesh_dim_names(self) -> tuple[str, str, str]:
        return ("pp", "dp", "tp")

    def describe(self) -> str:
        """Every group of each kind, as text (for a lesson cell)."""
        lines = [f"RankGrid(dp_size={self.dp_size}, pp_size={self.pp_size}, "
                 f"tp_size={self.tp_size}): {self.world_size} ranks, tp fastest, then dp, then pp"]
        for axis in AXES:
            groups = " ".join(str(g) for g in self.groups(axis))
            lines.append(f"  {axis} groups ({_WHAT[axis]}): {groups}")
        return "\n".join(lines)

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank!r} is outside this grid of {self.world_size} ranks "
                             f"(0..{self.world_size - 1})")


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's coordinates in the grid and its torch process group along each axis."""

    grid: RankGrid
    rank: int  # global rank
    coords: GridCoords  # (dp_rank, pp_rank, tp_rank)
    dp: Any  # torch.distributed.ProcessGroup of dp_group_ranks(rank)
    pp: Any  # ... of pp_group_ranks(rank)
    tp: Any  # ... of tp_group_ranks(rank)

    def group(self, axis: str):
        return getattr(self, _check_axis(axis))


def new_groups(grid: RankGrid, backend: str | None = None) -> ParallelGroups:
    """Create the process groups of every axis and return the ones this rank belongs to.

    Call it on every rank after init_process_group (inside run_on_ranks, for instance).
    torch requires every rank to call dist.new_group for EVERY group, members or not, in the
    same order: a rank that skipped the groups it is not in would pair its next new_group with
    another rank's different one and hang. So: each axis in AXES order, each group in
    grid.groups(axis) order, on every rank."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("new_groups needs the default process group: call it on every rank "
                           "inside run_on_ranks (or after dist.init_process_group)")
    grid.check_world_size(dist.get_world_size())
    rank = dist.get_rank()
    mine = {}
    for axis in AXES:
        for ranks in grid.groups(axis):
            group = dist.new_group(ranks, backend=backend)
            if rank in ranks:
                mine[axis] = group
    return ParallelGroups(grid, rank, grid.coords(rank), mine["dp"], mine["pp"], mine["tp"])


def device_mesh(grid: RankGrid, device_type: str | None = None):
    """The same grid as a torch DeviceMesh with dims ("pp", "dp", "tp"); mesh["tp"] is this
    rank's TP sub-mesh. device_type: "cuda" or "cpu"; None: the runner's device."""
    from torch.distributed.device_mesh import init_device_mesh

    if device_type is None:
        import gpulab

        device_type = gpulab.runner.device_kind
    return init_device_mesh(device_type, grid.mesh_shape, mesh_dim_names=grid.mesh_dim_names)


def _check_axis(axis: str) -> str:
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}: use one of {', '.join(AXES)}")
    return axis
