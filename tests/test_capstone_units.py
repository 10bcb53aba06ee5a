"""gpulab.capstone without a cluster: the config's presets, each step's batch, the plan's checks,
the single-process reference, and the profile breakdown's arithmetic."""

import pytest
import torch

from gpulab.capstone import (
    PRESETS,
    ParallelPlan,
    capstone_config,
    rank_batch,
    reference_losses,
    token_batch,
)
from gpulab.capstone.profile import is_communication
from gpulab.models import GPT

pytestmark = pytest.mark.capstone


def test_presets_are_tiny_on_cpu_and_hundreds_of_millions_on_gpu():
    assert capstone_config().name == "tiny"  # the cpu runner's pick here
    tiny, big = PRESETS["tiny"], PRESETS["gpt-400m"]
    assert tiny.n_params == sum(p.numel() for p in GPT(tiny.model).parameters())
    assert tiny.n_params < 2e6
    assert 300e6 < big.n_params < 450e6
    assert capstone_config("tiny", steps=3).steps == 3


def test_config_refuses_what_cannot_be_built():
    with pytest.raises(ValueError, match="unknown capstone size"):
        capstone_config("huge")
    with pytest.raises(TypeError, match="no field n_layers"):
        capstone_config("tiny", n_layers=3)
    with pytest.raises(ValueError, match="not a multiple of n_head"):
        capstone_config("tiny", n_head=3)


def test_batches_depend_on_seed_and_step_only_and_split_over_ranks():
    config = capstone_config("tiny")
    x, y = token_batch(config, 5)
    assert x.shape == y.shape == (config.batch_size, config.seq_len)
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
    assert torch.equal(token_batch(config, 5)[0], x)
    assert not torch.equal(token_batch(config, 6)[0], x)
    parts = [rank_batch(config, 5, r, 2, m, 2)[0] for r in range(2) for m in range(2)]
    assert torch.equal(torch.cat(parts), x)  # dp ranks x microbatches tile the global batch
    with pytest.raises(ValueError, match="must divide by dp_size x n_micro"):
        rank_batch(config, 0, 0, 3)


def test_plan_check_says_what_to_change():
    config = capstone_config("tiny")
    ParallelPlan(dp_size=2, tp_size=2).check(4, 2, config)
    with pytest.raises(ValueError, match="but the cluster has 4 ranks"):
        ParallelPlan(dp_size=2).check(4, 2, config)
    with pytest.raises(ValueError, match="stays inside one node"):
        ParallelPlan(dp_size=1, tp_size=4).check(4, 2, config)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        ParallelPlan(dp_size=4, grad_accum_steps=3).check(4, 2, config)
    with pytest.raises(ValueError, match="precision must be one of"):
        ParallelPlan(dp_size=4, precision="fp8").check(4, 2, config)
    assert ParallelPlan(dp_size=4, grad_accum_steps=2).micro_batch_size(config) == 2


def test_reference_learns_and_mixed_precision_stays_close():
    config = capstone_config("tiny", steps=4)
    fp32, bf16 = reference_losses(config), reference_losses(config, precision="bf16")
    assert fp32[-1] < fp32[0] - 0.3  # the rule in the data is learnable
    assert max(abs(a - b) for a, b in zip(fp32, bf16, strict=True)) < 0.01
    assert reference_losses(config) == fp32  # deterministic


def test_communication_is_told_apart_from_compute():
    for name in ("c10d::_allgather_base_", "gloo:all_reduce", "ncclDevKernel_AllGather_RING"):
        assert is_communication(name)
    for name in ("aten::addmm", "FSDP::pre_forward", "aten::copy_"):
        assert not is_communication(name)
