"""The capstone on a GPU runner (skipped without an NVIDIA GPU): the same loop with nccl, fp16
with a GradScaler and bf16, the CUDA allocator's peak, and the profile from the device's
timeline; then the gpu runner's own size, a GPT of ~400 M parameters, for two steps.

One process on one GPU (a 1 x 1 "cluster"): a machine with one GPU cannot hold 4 ranks of nccl.
Run directly with `GPULAB_RUNNER=gpu python tests/test_capstone_gpu.py` to see the figures."""

import math
import tempfile
from pathlib import Path

import pytest
from capstone_code import load_checkpoint, predict_memory, save_checkpoint, shard_model

from gpulab.capstone import ParallelPlan, capstone_config, reference_losses, run_capstone

pytestmark = [pytest.mark.gpu, pytest.mark.capstone, pytest.mark.slow]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_killed_run_resumes_exactly_on_a_gpu(tmp_path, precision):
    config = capstone_config("tiny", steps=6, checkpoint_every=2)
    plan = ParallelPlan(dp_size=1, precision=precision, grad_accum_steps=2,
                        budget_bytes=2**30)
    run = run_capstone(shard_model, save_checkpoint, load_checkpoint, plan=plan, config=config,
                       nodes=1, procs_per_node=1, checkpoint_dir=tmp_path, kill_at_step=3,
                       kill_rank=0, max_restarts=1, measure_step=4, profile_step=5,
                       isolation="loopback")
    assert run.ok, run.error
    first, second = run.attempt_losses(0), run.attempt_losses(1)
    assert run.start_step == 2 and second[2] == first[2]  # replayed bit for bit
    losses = [first[0], first[1], *(second[s] for s in range(2, 6))]
    reference = reference_losses(config, 6)
    assert max(abs(a - b) for a, b in zip(losses, reference, strict=True)) < 0.05
    peak = run.peak_bytes[0]
    print(f"{precision}: peak {peak} bytes, predicted {predict_memory(config, plan)}; "
          f"profile {run.profile(0)}")
    assert 0 < peak < plan.budget_bytes
    assert run.profile(0)["compute_s"] > 0


def test_the_gpu_size_trains():
    config = capstone_config(None, steps=2)  # the runner's size: gpt-400m on a GPU
    assert config.name == "gpt-400m"
    plan = ParallelPlan(dp_size=1, precision="bf16", grad_accum_steps=8,
                        activation_checkpointing=True, budget_bytes=60 * 2**30)
    run = run_capstone(shard_model, plan=plan, config=config, nodes=1, procs_per_node=1,
                       measure_step=1, isolation="loopback", timeout_s=300)
    assert run.ok, run.error
    assert all(math.isfinite(v) for v in run.losses) and run.losses[1] < run.losses[0]
    peak = run.peak_bytes[0]
    print(f"gpt-400m ({config.n_params / 1e6:.0f} M parameters): losses {run.losses}, peak "
          f"{peak / 2**30:.2f} GiB, predicted {predict_memory(config, plan) / 2**30:.2f} GiB")
    assert peak < plan.budget_bytes


if __name__ == "__main__":
    for precision in ("fp16", "bf16"):
        test_a_killed_run_resumes_exactly_on_a_gpu(Path(tempfile.mkdtemp()), precision)
    test_the_gpu_size_trains()
    print("all passed")
