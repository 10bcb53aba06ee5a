"""Checker for Lab 5, Part 5: Part 4's training as a job on a cloud, written as one JobSpec.

    check_cloud_job(cloud_job)                          visible: the scenario's limits, here
    check_cloud_job(cloud_job, need=answer_key(...))    hidden: the limits, computed by the grader

The learner's cloud_job() returns a gpulab JobSpec for SCENARIO: spot GCE machines with GPUs, a
host driver that caps the image's CUDA, DataLoader workers that need shared memory, and a
checkpoint interval that must bound the work lost to preemptions. The scenario's preemption
rate is per VM; the job's is the sum over its VMs, since any VM's preemption stops every process
of a synchronous job (lessons/01, and the quiz's q03). The checker renders what
gpulab renders from the spec (the Vertex AI job, the `docker run` line, the Dockerfile, and the
GCE Terraform, whose refusals it passes on) and reads back what the cloud would get: the
machines and spot from the job, torchrun's flags and the shared memory from the docker line
(shlex), the base image from the Dockerfile's FROM. The limits come from gpulab.cloud_cost's
formulas (limits()).
Taught in: lessons/06 (section 12) and lessons/01 (what a run costs)
"""

from __future__ import annotations

import re
import shlex

from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.training import call_learner
from gpulab.cloud_cost import max_checkpoint_interval, preemption_loss_fraction
from gpulab.distributed import JobSpec
from gpulab.distributed.cloud_templates import (
    render_docker_run,
    render_dockerfile,
    render_gce_terraform,
    vertex_job,
)

SCENARIO = {
    "machine_type": "a3-highgpu-8g",  # 8 x H100 80GB per VM
    "nodes": 2,
    "gpus_per_node": 8,
    "driver_cuda": (12, 4),  # the VMs' NVIDIA driver (550) runs CUDA up to 12.4
    "shm_gb_per_process": 2,  # each process's DataLoader workers share batches through /dev/shm
    "preemptions_per_vm_hour": 0.025,  # each spot VM reclaimed about once in 40 hours
    "restart_hours": 0.25,  # a reclaimed job is back in 15 minutes
    "save_minutes": 2.0,  # writing one checkpoint
    "max_loss_fraction": 0.05,  # at most 5% of the time lost to preemptions...
    "max_save_fraction": 0.05,  # ...and at most 5% spent saving checkpoints
}
INTERVAL_FLAG = "--checkpoint-every-min"  # the training script's flag, in JobSpec.args


def job_preemptions_per_hour(scenario: dict = SCENARIO) -> float:
    """The job's preemption rate λ: the sum of its VMs' rates (any VM's preemption stops it)."""
    return scenario["nodes"] * scenario["preemptions_per_vm_hour"]


def limits(scenario: dict = SCENARIO) -> dict:
    """What a right JobSpec for `scenario` must satisfy, as plain numbers (an answer_key)."""
    rate = job_preemptions_per_hour(scenario)
    longest = max_checkpoint_interval(rate, scenario["max_loss_fraction"],
                                      scenario["restart_hours"])
    one_vm = max_checkpoint_interval(scenario["preemptions_per_vm_hour"],
                                     scenario["max_loss_fraction"], scenario["restart_hours"])
    return {"machine_type": scenario["machine_type"], "nodes": scenario["nodes"],
            "gpus_per_node": scenario["gpus_per_node"],
            "world_size": scenario["nodes"] * scenario["gpus_per_node"],
            "max_cuda": list(scenario["driver_cuda"]),
            "min_shm_gb": scenario["gpus_per_node"] * scenario["shm_gb_per_process"],
            "min_interval_min": scenario["save_minutes"] / scenario["max_save_fraction"],
            "max_interval_min": 60 * longest,
            "one_vm_max_interval_min": 60 * one_vm,  # what one VM's rate would allow: a slip
            "preemptions_per_hour": rate,
            "preemptions_per_vm_hour": scenario["preemptions_per_vm_hour"],
            "restart_hours": scenario["restart_hours"],
            "save_minutes": scenario["save_minutes"]}


def check_cloud_job(cloud_job, need: dict | None = None) -> None:
    """cloud_job() returns a JobSpec whose rendered Terraform, docker run line and Dockerfile run
    the scenario's job: its machines, spot, world size, shared memory, an image whose CUDA the
    driver runs, and a checkpoint interval within the limits."""
    require_own_function(cloud_job, "cloud_job")
    need = limits() if need is None else need
    spec = call_learner(cloud_job, "cloud_job", case="the lab's scenario")
    if not isinstance(spec, JobSpec):
        raise AssertionError(f"cloud_job() returned {type(spec).__name__}: return a "
                             "gpulab.distributed.JobSpec(...).")
    job, run, dockerfile = _render(spec)
    _check_machines(job, need)
    _check_run(run, need)
    _check_image(dockerfile, need)


def _render(spec):
    try:
        render_gce_terraform(spec)  # refuses what GCE would (a machine's GPU count, spot restarts)
        return vertex_job(spec), render_docker_run(spec, head_node="node-0"), \
            render_dockerfile(spec)
    except ValueError as error:  # the renderers say what a cloud would refuse, and what to set
        raise AssertionError(f"gpulab could not render your JobSpec: {error}") from None


def _check_machines(job: dict, need: dict) -> None:
    pools = job["workerPoolSpecs"]
    got = {"machine_type": pools[0]["machineSpec"]["machineType"],
           "nodes": sum(pool["replicaCount"] for pool in pools)}
    for key in ("machine_type", "nodes"):
        if got[key] != need[key]:
            raise AssertionError(f"Set {key}={need[key]!r}, the scenario's: the job asks for "
                                 f"{got[key]!r}.")
    if job["scheduling"].get("strategy") != "SPOT":
        raise AssertionError("Set spot=True: the scenario runs on spot VMs (a fraction of the "
                             "on-demand price), and the job asks for on-demand ones.")


def _check_run(run: str, need: dict) -> None:
    words = shlex.split(run)
    flags = dict(w.split("=", 1) for w in words if w.startswith("--") and "=" in w)
    gpus = int(flags.get("--gpus", 0))
    if gpus != need["gpus_per_node"]:
        raise AssertionError(f"Give each container all {need['gpus_per_node']} GPUs of its VM "
                             f"(gpus_per_node): `docker run --gpus={gpus}` sees {gpus}.")
    world = int(flags["--nnodes"]) * int(flags["--nproc-per-node"])
    if world != need["world_size"]:
        raise AssertionError(
            f"One process per GPU: procs_per_node={need['gpus_per_node']}. torchrun starts "
            f"{flags['--nnodes']} x {flags['--nproc-per-node']} = {world} processes for "
            f"{need['world_size']} GPUs.")
    shm = flags.get("--shm-size")
    if "--ipc=host" not in words:
        shm_gb = int(shm.rstrip("g"))
        if shm_gb < need["min_shm_gb"]:
            raise AssertionError(
                f"Give /dev/shm {need['min_shm_gb']} GiB per node (shm_gb): "
                f"{need['gpus_per_node']} processes x {need['min_shm_gb'] // need['gpus_per_node']}"
                f" GiB for their DataLoader workers. --shm-size={shm} makes workers die with a "
                "bus error.")
    _check_interval(words, need)


def _check_interval(words: list[str], need: dict) -> None:
    if INTERVAL_FLAG not in words:
        raise AssertionError(f"Pass the checkpoint interval to the script: args=("
                             f"'{INTERVAL_FLAG}', '<minutes>'). On spot VMs it decides how much "
                             "work a preemption throws away.")
    minutes = float(words[words.index(INTERVAL_FLAG) + 1])
    rate = need["preemptions_per_hour"]
    lost = preemption_loss_fraction(rate, minutes / 60, need["restart_hours"])
    if minutes > need["max_interval_min"]:
        vms = round(rate / need["preemptions_per_vm_hour"])
        slip = (f" That interval fits one VM's rate, {need['preemptions_per_vm_hour']:g}/h; the "
                f"job's is the sum over its {vms} VMs, λ = {rate:g}/h: either VM's preemption "
                "stops the whole job." if minutes <= need["one_vm_max_interval_min"] else "")
        raise AssertionError(
            f"Checkpoint at most every {need['max_interval_min']:.0f} minutes: every {minutes:g} "
            f"loses λ(τ/2 + r) = {lost:.1%} of the time to preemptions, more than 5% "
            f"(gpulab.cloud_cost.max_checkpoint_interval).{slip}")
    if minutes < need["min_interval_min"]:
        saving = need["save_minutes"] / minutes
        raise AssertionError(
            f"Checkpoint at least {need['min_interval_min']:.0f} minutes apart: a save takes "
            f"{need['save_minutes']:g} minutes, so every {minutes:g} spends {saving:.1%} of the "
            "time saving, more than 5%.")


def _check_image(dockerfile: str, need: dict) -> None:
    base = next(line.split()[1] for line in dockerfile.splitlines() if line.startswith("FROM "))
    found = re.search(r"cuda(\d+)\.(\d+)", base)
    top = ".".join(map(str, need["max_cuda"]))
    if not found:
        raise AssertionError(
            f"Start the image from a CUDA build of PyTorch whose tag names its CUDA (e.g. "
            f"pytorch/pytorch:<torch>-cuda<X.Y>-cudnn9-runtime): {base!r} does not say, so it "
            f"cannot be checked against the VMs' driver, which runs CUDA up to {top}.")
    cuda = [int(found.group(1)), int(found.group(2))]
    if cuda > list(need["max_cuda"]):
        raise AssertionError(
            f"Use an image built for CUDA {top} or older: {base} needs CUDA "
            f"{cuda[0]}.{cuda[1]}, newer than the VMs' driver runs (the driver lives on the "
            "host, not in the image), so torch.cuda.is_available() would be False.")
