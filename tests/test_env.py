"""Runner detection: the decision table, the simulator switch and the errors a learner sees."""

import os
import subprocess
import sys
import types

import pytest

import gpulab
from gpulab import env


def detect(value=None, gpus=0):
    environ = {} if value is None else {"GPULAB_RUNNER": value}
    return env.detect(environ, gpu_count=lambda: gpus)


@pytest.mark.parametrize(
    "value, gpus, expected",
    [(None, 0, "cpu"), (None, 2, "gpu"), ("auto", 1, "gpu"), ("cpu", 4, "cpu"),
     ("gpu", 1, "gpu"), (" GPU ", 1, "gpu"), ("", 0, "cpu")],
)
def test_detect_decision_table(value, gpus, expected):
    runner = detect(value, gpus)
    assert runner.name == expected
    assert runner.simulator == (expected == "cpu")


def test_gpu_runner_without_gpu_fails_with_advice():
    with pytest.raises(env.RunnerError, match="no NVIDIA GPU is usable.*nvidia-smi"):
        detect("gpu", 0)


def test_unknown_runner_value_lists_choices():
    with pytest.raises(env.RunnerError, match="auto, cpu, gpu"):
        detect("tpu", 0)


def test_pick_chooses_by_runner():
    assert detect("cpu", 1).pick(cpu=32, gpu=4096) == 32
    assert detect("gpu", 1).pick(cpu=32, gpu=4096) == 4096


def test_forced_cpu_runner_keeps_torch_on_cpu_even_with_a_gpu():
    runner = detect("cpu", 1)
    assert runner.device_kind == "cpu"
    assert runner.backend == "gloo"


def test_cpu_autocast_recipe_is_bf16_without_scaler():
    recipe = detect("cpu", 0).autocast
    assert (recipe.device_type, recipe.dtype_name, recipe.use_grad_scaler) == (
        "cpu", "bfloat16", False)
    import torch

    assert recipe.dtype is torch.bfloat16


def test_switch_sets_variable_before_numba_cuda_loads():
    environ, modules = {}, {}
    env.switch_simulator(detect("cpu"), environ, modules)
    assert environ["NUMBA_ENABLE_CUDASIM"] == "1"
    env.switch_simulator(detect("gpu", 1), environ, modules)
    assert environ["NUMBA_ENABLE_CUDASIM"] == "0"


def test_switch_refuses_numba_cuda_loaded_the_other_way():
    fake_cuda = types.SimpleNamespace(jit=types.SimpleNamespace(__module__="numba.cuda.decorators"))
    with pytest.raises(env.RunnerError, match="Restart the kernel"):
        env.switch_simulator(detect("cpu"), {}, {"numba.cuda": fake_cuda})


@pytest.mark.skipif(gpulab.runner.name != "cpu", reason="the gpu runner uses the real driver")
def test_this_process_runs_on_the_simulator():
    from numba import cuda

    assert gpulab.runner.name == "cpu"
    assert cuda.jit.__module__.startswith("numba.cuda.simulator")


def _python(code, **extra_env):
    environ = {k: v for k, v in os.environ.items()
               if k not in ("GPULAB_RUNNER", "NUMBA_ENABLE_CUDASIM")}
    environ.update(extra_env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environ, timeout=120)


def test_import_gpulab_after_numba_still_turns_on_the_simulator():
    # numba (not numba.cuda) loaded first: its config is re-read, so this must still work
    # GPULAB_RUNNER=cpu: on a machine with a GPU, auto would rightly pick the real driver
    done = _python("import numba, gpulab; from numba import cuda; print(cuda.jit.__module__)",
                   GPULAB_RUNNER="cpu")
    assert done.returncode == 0, done.stderr
    assert "simulator" in done.stdout


def test_import_gpulab_after_real_numba_cuda_says_restart():
    done = _python("from numba import cuda; import gpulab", GPULAB_RUNNER="cpu")
    assert done.returncode != 0
    assert "Restart the kernel" in done.stderr


@pytest.mark.skipif(gpulab.runner.gpu_count > 0, reason="this machine has a GPU")
def test_gpu_runner_on_cpu_machine_fails_at_import():
    done = _python("import gpulab", GPULAB_RUNNER="gpu")
    assert done.returncode != 0
    assert "RunnerError" in done.stderr and "no NVIDIA GPU is usable" in done.stderr
