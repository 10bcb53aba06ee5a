"""The (dp, pp, tp) rank grid: group structure on paper, Megatron-LM's documented layout, and
real gloo process groups (ours and torch's DeviceMesh) holding the ranks the grid says."""

import itertools

import pytest
import torch

from gpulab.distributed import run_on_ranks
from gpulab.distributed.groups import AXES, GridCoords, RankGrid

GRIDS = [RankGrid(dp, pp, tp) for dp, pp, tp in itertools.product((1, 2, 3), (1, 2, 4), (1, 2, 3))]


# ---- structure -------------------------------------------------------------------------------

@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"dp{g.dp_size}-pp{g.pp_size}-tp{g.tp_size}")
def test_groups_partition_the_world_along_every_axis(grid):
    world = range(grid.world_size)
    for axis in AXES:
        groups = grid.groups(axis)
        members = sorted(r for g in groups for r in g)
        assert members == list(world), f"{axis}: every rank in exactly one group"
        assert len(groups) == grid.world_size // grid.size(axis)
        for group in groups:
            assert len(group) == grid.size(axis)
            coords = [grid.coords(r) for r in group]
            # along the axis: coordinate i at position i; the other two coordinates fixed
            assert [c._asdict()[f"{axis}_rank"] for c in coords] == list(range(len(group)))
            others = {tuple(v for k, v in c._asdict().items() if k != f"{axis}_rank")
                      for c in coords}
            assert len(others) == 1, f"{axis} group {group} mixes places {others}"
            for r in group:
                assert grid.group_ranks(axis, r) == group
    for group in grid.groups("tp"):  # tensor parallel ranks are neighbours (one node)
        assert group == list(range(group[0], group[0] + grid.tp_size))


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"dp{g.dp_size}-pp{g.pp_size}-tp{g.tp_size}")
def test_coords_round_trip_and_stage_neighbours(grid):
    seen = set()
    for rank in range(grid.world_size):
        c = grid.coords(rank)
        assert isinstance(c, GridCoords) and grid.rank(*c) == rank
        seen.add(c)
        assert grid.stage_of(rank) == c.pp_rank
        assert grid.is_first_stage(rank) == (c.pp_rank == 0)
        assert grid.is_last_stage(rank) == (c.pp_rank == grid.pp_size - 1)
        pipeline = grid.pp_group_ranks(rank)
        nxt, prev = grid.next_stage_rank(rank), grid.prev_stage_rank(rank)
        assert nxt == (pipeline[c.pp_rank + 1] if c.pp_rank + 1 < grid.pp_size else None)
        assert prev == (pipeline[c.pp_rank - 1] if c.pp_rank > 0 else None)
        assert grid.next_stage_rank(rank, wrap=True) == pipeline[(c.pp_rank + 1) % grid.pp_size]
        assert grid.prev_stage_rank(rank, wrap=True) == pipeline[(c.pp_rank - 1) % grid.pp_size]
    assert len(seen) == grid.world_size


def test_layout_is_megatrons_documented_example():
    # megatron/core/parallel_state.py, initialize_model_parallel's docstring: 16 GPUs, tp=2, pp=4.
    grid = RankGrid.for_world(16, pp_size=4, tp_size=2)
    assert grid.dp_size == 2
    assert grid.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14],
                                 [13, 15]]
    assert grid.groups("tp") == [[2 * i, 2 * i + 1] for i in range(8)]
    assert grid.groups("pp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]


def test_device_mesh_layout_matches_the_grid():
    # init_device_mesh numbers a mesh arange(world).view(mesh_shape): index it by our coords.
    grid = RankGrid(3, 2, 2)
    mesh = torch.arange(grid.world_size).view(grid.mesh_shape)
    names = grid.mesh_dim_names
    for rank in range(grid.world_size):
        c = grid.coords(rank)._asdict()
        assert mesh[tuple(c[f"{n}_rank"] for n in names)].item() == rank


def test_clear_errors():
    with pytest.raises(ValueError, match="tp_size must be an int >= 1"):
        RankGrid(2, 1, 0)
    with pytest.raises(ValueError, match="dp_size must be an int >= 1"):
        RankGrid(True, 1, 1)
    with pytest.raises(ValueError, match=r"2 \* 2 \* 2 = 8 ranks, but the world has 4"):
        RankGrid(2, 2, 2).check_world_size(4)
    RankGrid(1, 2, 2).check_world_size(4)
    with pytest.raises(ValueError, match=r"rank 8 is outside this grid of 8 ranks \(0..7\)"):
        RankGrid(2, 2, 2).coords(8)
    with pytest.raises(ValueError, match="rank -1 is outside"):
        RankGrid(2, 2, 2).tp_group_ranks(-1)
    with pytest.raises(ValueError, match="pp_rank=2 is outside 0..1"):
        RankGrid(2, 2, 2).rank(0, 2, 0)
    with pytest.raises(ValueError, match="not divisible by pp_size"):
        RankGrid.for_world(6, pp_size=4)
    with pytest.raises(ValueError, match="unknown axis 'cp'"):
        RankGrid(2, 2, 2).groups("cp")
    assert "tp groups (tensor parallel): [0, 1] [2, 3]" in RankGrid(2, 1, 2).describe()


# ---- real process groups ---------------------------------------------------------------------

GRID_SIZES = [(2, 1, 2), (1, 2, 2), (2, 2, 1)]  # (dp, pp, tp) on 4 ranks


def _members_on_four_ranks(rank, world_size):
    """For each grid: all_reduce 2**rank in this rank's group of each axis (the sum's bits say
    exactly who took part), and the ranks of DeviceMesh's group along each dim."""
    import torch.distributed as dist

    from gpulab.distributed.groups import RankGrid, device_mesh, new_groups

    out = {}
    for sizes in GRID_SIZES:
        grid = RankGrid(*sizes)
        groups = new_groups(grid)
        members = {}
        for axis in ("tp", "dp", "pp"):
            x = torch.tensor([2.0 ** rank], dtype=torch.float64)
            dist.all_reduce(x, group=groups.group(axis))
            members[axis] = [r for r in range(world_size) if int(x.item()) >> r & 1]
        mesh = device_mesh(grid, "cpu")
        mesh_ranks = {axis: dist.get_process_group_ranks(mesh.get_group(axis))
                      for axis in grid.mesh_dim_names}
        out[sizes] = (tuple(groups.coords), members, mesh_ranks)
    try:
        new_groups(RankGrid(2, 2, 2))
        wrong_world = None
    except ValueError as error:
        wrong_world = str(error)
    return out, wrong_world


@pytest.mark.dist
def test_real_groups_hold_the_grids_ranks():
    # gloo on every runner: this is about which ranks meet, and CPU tensors travel on gloo
    per_rank = run_on_ranks(_members_on_four_ranks, 4, timeout_s=90, backend="gloo")
    for rank, (out, wrong_world) in enumerate(per_rank):
        assert "= 8 ranks, but the world has 4" in wrong_world
        for sizes in GRID_SIZES:
            grid = RankGrid(*sizes)
            coords, members, mesh_ranks = out[sizes]
            assert coords == tuple(grid.coords(rank))
            for axis in AXES:
                want = grid.group_ranks(axis, rank)
                assert members[axis] == want, (
                    f"grid {sizes}, rank {rank}: the {axis} all_reduce summed over "
                    f"{members[axis]}, expected {want}")
                assert sorted(mesh_ranks[axis]) == want, (
                    f"grid {sizes}, rank {rank}: DeviceMesh's {axis} group is "
                    f"{mesh_ranks[axis]}, the grid says {want}")
