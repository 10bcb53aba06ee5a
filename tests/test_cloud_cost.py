"""The cloud cost napkin maths (gpulab.cloud_cost) and the instance table it is used with
(gpulab.cloud_instances): hand-computed cases, the model's own identities, and its refusals."""

import math

import pytest

from gpulab.cloud_cost import (
    estimate_run,
    max_checkpoint_interval,
    preemption_loss_fraction,
    run_cost_usd,
    training_flops,
    training_hours,
    young_checkpoint_interval,
)
from gpulab.cloud_instances import (
    INSTANCES,
    PRICES_AS_OF,
    PROVIDERS,
    get_instance,
    instances_with,
)
from gpulab.gpu_specs import get_gpu


def test_run_cost_is_price_times_gpus_times_hours():
    assert run_cost_usd(usd_per_gpu_hour=2.5, n_gpus=8, hours=10) == pytest.approx(200.0)
    assert run_cost_usd(3.67, 1, 0) == 0


def test_training_hours_is_six_n_d_over_the_delivered_flops():
    assert training_flops(1e9, 2e10) == pytest.approx(1.2e20)
    # 8 A100s at 312 bf16 TFLOP/s and 40% MFU deliver 998.4 TFLOP/s.
    hours = training_hours(1e9, 2e10, "A100 40GB SXM", n_gpus=8)
    assert hours == pytest.approx(1.2e20 / (8 * 312e12 * 0.4) / 3600)
    assert training_hours(1e9, 2e10, "A100", 16) == pytest.approx(hours / 2)
    with pytest.raises(ValueError, match="mfu"):
        training_hours(1e9, 2e10, "A100", 8, mfu=1.5)


def test_preemption_loss_is_rate_times_half_interval_plus_restart():
    # One preemption every 10 hours, checkpoints every hour, 6-minute restarts: 6% lost.
    assert preemption_loss_fraction(0.1, 1.0, 0.1) == pytest.approx(0.06)
    assert preemption_loss_fraction(0.0, 5.0, 1.0) == 0


def test_max_checkpoint_interval_is_the_bound_that_meets_the_loss_budget():
    interval = max_checkpoint_interval(0.1, max_loss_fraction=0.05, restart_hours=0.1)
    assert interval == pytest.approx(0.8)  # 2 (0.05 / 0.1 - 0.1)
    assert preemption_loss_fraction(0.1, interval, 0.1) == pytest.approx(0.05)
    assert max_checkpoint_interval(0.0, 0.05) == math.inf
    with pytest.raises(ValueError, match="restarts alone"):
        max_checkpoint_interval(0.5, max_loss_fraction=0.02, restart_hours=0.1)


def test_young_interval_minimises_the_expected_wall_time():
    rate, save = 0.2, 0.05
    best = young_checkpoint_interval(save, rate)
    assert best == pytest.approx(math.sqrt(2 * save / rate))

    def wall(interval):
        return estimate_run(100, 8, 1.0, rate, interval, save_hours=save).wall_hours

    # First order: the exact minimum of the model lies close to Young's interval.
    grid = [best * f for f in (0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 2.0)]
    assert min(grid, key=wall) in (best * 0.9, best, best * 1.1)
    with pytest.raises(ValueError):
        young_checkpoint_interval(0.0, rate)


def test_on_demand_run_costs_exactly_its_work():
    run = estimate_run(work_hours=50, n_gpus=8, usd_per_gpu_hour=4.0)
    assert (run.wall_hours, run.lost_hours, run.expected_preemptions) == (50, 0, 0)
    assert run.usd == pytest.approx(1600.0) and run.lost_usd == 0


def test_spot_run_adds_up_work_saving_and_losses():
    work, rate, interval, restart, save = 100.0, 0.1, 1.0, 0.1, 0.02
    run = estimate_run(work, 8, 1.2, rate, interval, restart_hours=restart, save_hours=save)
    assert run.save_hours == pytest.approx(work * save / interval)
    assert run.wall_hours == pytest.approx(work * (1 + save / interval) / (1 - 0.06))
    assert run.work_hours + run.save_hours + run.lost_hours == pytest.approx(run.wall_hours)
    assert run.expected_preemptions == pytest.approx(rate * run.wall_hours)
    assert run.lost_usd == pytest.approx(run.lost_hours * 8 * 1.2)
    assert run.usd == pytest.approx(run.wall_hours * 8 * 1.2)


def test_spot_is_cheaper_until_preemptions_eat_the_discount():
    on_demand = estimate_run(100, 8, 4.0)
    spot = estimate_run(100, 8, 4.0 * 0.35, 0.1, 0.5, restart_hours=0.1)
    assert spot.usd < on_demand.usd / 2
    rare_checkpoints = estimate_run(100, 8, 4.0 * 0.35, 0.1, 8.0, restart_hours=0.1)
    assert rare_checkpoints.lost_usd > 5 * spot.lost_usd


@pytest.mark.parametrize("kwargs, message", [
    (dict(preemptions_per_hour=0.1), "needs checkpoint_interval_hours"),
    (dict(preemptions_per_hour=0.5, checkpoint_interval_hours=4.0), "never finish"),
    (dict(checkpoint_interval_hours=0.0), "must be > 0"),
    (dict(n_gpus=0), "n_gpus >= 1"),
])
def test_estimate_run_refuses_what_cannot_be_estimated(kwargs, message):
    args = dict(work_hours=10.0, n_gpus=8, usd_per_gpu_hour=1.0) | kwargs
    with pytest.raises(ValueError, match=message):
        estimate_run(**args)


def test_every_instance_names_a_gpu_of_the_spec_sheet():
    for instance in INSTANCES:
        assert instance.provider in PROVIDERS
        assert get_gpu(instance.gpu) is instance.spec  # the spec sheet knows the GPU
        assert instance.gpu_memory_gb == instance.n_gpus * instance.spec.memory_gb
        assert instance.usd_per_hour > 0
    assert len({i.name for i in INSTANCES}) == len(INSTANCES)
    assert PRICES_AS_OF  # the prices carry their date


@pytest.mark.parametrize("name, gpu, n_gpus, memory_gb", [
    ("a2-highgpu-8g", "A100 40GB SXM", 8, 320),
    ("a2-ultragpu-8g", "A100 80GB SXM", 8, 640),
    ("a3-highgpu-8g", "H100 SXM", 8, 640),
    ("g2-standard-8", "L4", 1, 24),
    ("n1-standard-8 + 1 x T4", "T4", 1, 16),
    ("p4d.24xlarge", "A100 40GB SXM", 8, 320),
    ("p5.48xlarge", "H100 SXM", 8, 640),
    ("g5.xlarge", "A10G", 1, 24),
    ("g6.xlarge", "L4", 1, 24),
    ("ND96asr_v4", "A100 40GB SXM", 8, 320),
    ("ND96isr_H100_v5", "H100 SXM", 8, 640),
])
def test_instances_carry_their_gpus(name, gpu, n_gpus, memory_gb):
    instance = get_instance(name.upper())  # any case
    assert (instance.spec.name, instance.n_gpus, instance.gpu_memory_gb) == (gpu, n_gpus, memory_gb)


def test_gce_rows_agree_with_the_machine_types_the_templates_know():
    from gpulab.distributed.cloud_templates import FIXED_GPU_MACHINES

    gce_gpu = {"nvidia-tesla-a100": "A100 40GB SXM", "nvidia-a100-80gb": "A100 80GB SXM",
               "nvidia-h100-80gb": "H100 SXM", "nvidia-l4": "L4"}
    for instance in INSTANCES:
        if instance.name in FIXED_GPU_MACHINES:
            gpu, count = FIXED_GPU_MACHINES[instance.name]
            assert (gce_gpu[gpu], count) == (instance.spec.name, instance.n_gpus), instance.name


def test_lookups_name_what_they_know():
    assert {i.provider for i in instances_with("h100")} == set(PROVIDERS)
    assert get_instance("a3-highgpu-8g").usd_per_gpu_hour == pytest.approx(88.49 / 8)
    with pytest.raises(KeyError, match="a3-highgpu-8g"):
        get_instance("x9-giant")
