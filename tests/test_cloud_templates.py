"""The JobSpec rendered for containers and Google Cloud (gpulab.distributed.cloud_templates), each
file read back with the parser its own tool would use: dockerfile-parse for the Dockerfile,
shlex and a docker-run argument parser for the `docker run` line, PyYAML for the Vertex AI
CustomJob, python-hcl2 for the Terraform. The torchrun command inside each is parsed by torchrun's
own argument parser, and the shell commands are run with a stand-in torchrun, so a test checks
what a node would start, not how the text looks. No cloud account, Docker or GPU is needed."""

import argparse
import dataclasses
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from unittest import mock

import hcl2
import pytest
import yaml
from dockerfile_parse import DockerfileParser
from torch.distributed.run import get_args_parser

from gpulab.distributed import JobSpec, render_pytorchjob, render_sbatch
from gpulab.distributed.cloud_templates import (
    machine_gpus,
    render_docker_run,
    render_dockerfile,
    render_gce_terraform,
    render_vertex_job,
    vertex_job,
)

ROOT = Path(__file__).resolve().parents[1]
AWKWARD = "it's ${HOME} %{x} \\ \"q\""  # a shell, Docker, YAML and HCL would each mangle it
# The course's example: 2 nodes x 8 H100 on GCE, spot.
SPEC = JobSpec(name="gpt-ddp", nodes=2, procs_per_node=8, gpus_per_node=8,
               script="/workspace/train.py", args=("--steps", "1000", "--note", AWKWARD),
               image="us-docker.pkg.dev/my-project/train/gpt-ddp:1",
               base_image="nvcr.io/nvidia/pytorch:24.05-py3", shm_gb=16, max_restarts=3,
               machine_type="a3-highgpu-8g", spot=True, time_limit="02:30:00",
               env={"NCCL_DEBUG": "WARN", "ODD": AWKWARD})
ENVIRONMENT = {"NCCL_DEBUG": "WARN", "ODD": AWKWARD, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchrun_args(command: list[str], pet: dict[str, str] | None = None) -> argparse.Namespace:
    """`command` as torchrun itself parses it, with `pet` as the PET_* variables it reads."""
    assert command[0] == "torchrun", f"not a torchrun command: {command[:3]}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PET_")} | (pet or {})
    with mock.patch.dict(os.environ, environ, clear=True):  # defaults are read when built
        parser = get_args_parser()
    return parser.parse_args(command[1:])


def assert_runs_the_spec(args: argparse.Namespace, spec: JobSpec, endpoint: str, rdzv_id: str):
    """The parsed torchrun command starts spec's job and meets at `endpoint`."""
    assert int(args.nnodes) * int(args.nproc_per_node) == spec.world_size == 16
    assert (args.nnodes, args.nproc_per_node) == (spec.nnodes, str(spec.procs_per_node))
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("c10d", endpoint, rdzv_id)
    assert args.max_restarts == spec.max_restarts
    assert [args.training_script, *args.training_script_args] == [spec.script, *spec.args]


def run_with_stand_ins(tmp_path: Path, command: list[str], env: dict[str, str]) -> list[str]:
    """Run `command` with stand-ins for torchrun, docker, nvidia-smi and gcloud that record their
    arguments; returns the lines recorded, one "<tool> <shell-quoted words>" per call."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir(parents=True)
    for tool in ("torchrun", "docker", "nvidia-smi", "gcloud"):
        stand_in = bin_dir / tool
        stand_in.write_text(f'#!{sys.executable}\nimport shlex, sys\nopen({str(log)!r}, "a")'
                            f'.write(shlex.join(["{tool}", *sys.argv[1:]]) + "\\n")\n')
        stand_in.chmod(stat.S_IRWXU)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", **env)
    subprocess.run(command, env=env, check=True, timeout=30)
    return log.read_text().splitlines()


def docker_run_args(words: list[str]) -> argparse.Namespace:
    """A `docker run` command line, parsed with the flags the renderer may use (any other flag
    fails the parse, so a new one is noticed here)."""
    assert words[:2] == ["docker", "run"]
    parser = argparse.ArgumentParser(prog="docker run", exit_on_error=False)
    parser.add_argument("--rm", action="store_true")
    for flag in ("--gpus", "--ipc", "--shm-size", "--network"):
        parser.add_argument(flag)
    parser.add_argument("-e", dest="env", action="append", default=[])
    parser.add_argument("image")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(words[2:])
    args.env = dict(pair.split("=", 1) for pair in args.env)
    return args


# --- Dockerfile ---------------------------------------------------------------------------------

def test_dockerfile_builds_the_image_that_starts_the_same_torchrun(tmp_path):
    dockerfile = DockerfileParser(path=str(tmp_path))
    dockerfile.content = render_dockerfile(SPEC)
    assert dockerfile.baseimage == SPEC.base_image == "nvcr.io/nvidia/pytorch:24.05-py3"
    instructions = [(i["instruction"], i["value"]) for i in dockerfile.structure
                    if i["instruction"] != "COMMENT"]
    assert ("WORKDIR", "/workspace") in instructions
    (copy,) = [value for name, value in instructions if name == "COPY"]
    assert json.loads(copy) == ["train.py", SPEC.script], "the script lands where torchrun looks"
    envs = dict(dockerfile.envs)
    assert envs.pop("PET_RDZV_ENDPOINT") == "localhost:29500"
    assert envs == ENVIRONMENT, "the environment as ENV, quoting and all"
    command = json.loads(dockerfile.cmd)  # exec form: a JSON array, no shell in between
    assert "--rdzv-endpoint" not in " ".join(command), "the endpoint is left to PET_RDZV_ENDPOINT"
    # torchrun reads the missing flag from the image's ENV, or from `docker run -e` on a node.
    assert_runs_the_spec(torchrun_args(command, {"PET_RDZV_ENDPOINT": "localhost:29500"}),
                         SPEC, "localhost:29500", "gpt-ddp")
    assert_runs_the_spec(torchrun_args(command, {"PET_RDZV_ENDPOINT": "10.0.0.2:29500"}),
                         SPEC, "10.0.0.2:29500", "gpt-ddp")


def test_dockerfile_needs_a_base_image_and_single_line_values():
    with pytest.raises(ValueError, match="base_image"):
        render_dockerfile(JobSpec(name="a", nodes=1, procs_per_node=1, script="t.py"))
    with pytest.raises(ValueError, match="newline"):
        render_dockerfile(JobSpec(name="a", nodes=1, procs_per_node=1, script="t.py",
                                  base_image="pytorch/pytorch", env={"X": "two\nlines"}))


# --- docker run ---------------------------------------------------------------------------------

def test_docker_run_line_pastes_into_a_shell_and_starts_one_node(tmp_path):
    line = render_docker_run(SPEC, head_node="10.0.0.2")
    assert "\n" not in line, "one line, to paste on every node"
    args = docker_run_args(shlex.split(line))
    assert args.rm and args.network == "host", "NCCL reaches the other nodes on the host's network"
    assert args.gpus == "8" == str(SPEC.gpus_per_node)
    assert (args.shm_size, args.ipc) == ("16g", None), "shm_gb=16 sizes /dev/shm"
    assert args.env == ENVIRONMENT and args.image == SPEC.image
    assert_runs_the_spec(torchrun_args(args.command), SPEC, "10.0.0.2:29500", "gpt-ddp")
    # The same words reach docker through a real shell.
    (call,) = run_with_stand_ins(tmp_path, ["bash", "-c", line], {})
    assert shlex.split(call) == shlex.split(line)

    single = JobSpec(name="one", nodes=1, procs_per_node=2, script="t.py")
    args = docker_run_args(shlex.split(render_docker_run(single)))
    assert (args.ipc, args.shm_size, args.gpus) == ("host", None, None), "no GPUs: no --gpus"
    assert torchrun_args(args.command).rdzv_endpoint == "localhost:29500"
    with pytest.raises(ValueError, match="head_node"):
        render_docker_run(SPEC)


# --- Vertex AI ----------------------------------------------------------------------------------

def test_vertex_job_parses_back_and_its_command_meets_at_the_primary(tmp_path):
    job = yaml.safe_load(render_vertex_job(SPEC))
    assert job == vertex_job(SPEC), "the hand-written YAML parses to the dict it came from"
    assert set(job) == {"workerPoolSpecs", "scheduling"}, "a CustomJobSpec, as --config reads it"
    primary, workers = job["workerPoolSpecs"]
    assert primary["replicaCount"] == 1, "worker pool 0 is the primary replica alone"
    assert primary["replicaCount"] + workers["replicaCount"] == SPEC.nodes
    assert job["scheduling"] == {"timeout": "9000s", "strategy": "SPOT"}  # 02:30:00
    for i, pool in enumerate((primary, workers)):
        assert pool["machineSpec"] == {"machineType": "a3-highgpu-8g",
                                       "acceleratorType": "NVIDIA_H100_80GB",
                                       "acceleratorCount": 8}
        container = pool["containerSpec"]
        assert container["imageUri"] == SPEC.image
        assert {e["name"]: e["value"] for e in container["env"]} == ENVIRONMENT
        assert container["command"][:2] == ["bash", "-c"]
        # Vertex AI sets MASTER_ADDR and MASTER_PORT on every replica: bash expands them.
        (call,) = run_with_stand_ins(tmp_path / f"pool{i}", container["command"],
                                     {"MASTER_ADDR": "workerpool0-0", "MASTER_PORT": "3333"})
        assert_runs_the_spec(torchrun_args(shlex.split(call)), SPEC, "workerpool0-0:3333",
                             "gpt-ddp")

    on_demand = vertex_job(JobSpec(name="one", nodes=1, procs_per_node=1, script="t.py",
                                   machine_type="n1-standard-8"))
    (pool,) = on_demand["workerPoolSpecs"]
    assert pool["machineSpec"] == {"machineType": "n1-standard-8"}, "no GPU, no accelerator"
    assert on_demand["scheduling"] == {"timeout": "3600s"}, "not spot: no strategy"
    t4 = vertex_job(JobSpec(name="t4", nodes=1, procs_per_node=1, script="t.py",
                            gpus_per_node=1, machine_type="n1-standard-8",
                            accelerator="nvidia-tesla-t4"))
    assert t4["workerPoolSpecs"][0]["machineSpec"]["acceleratorType"] == "NVIDIA_TESLA_T4"


# --- GCE Terraform ------------------------------------------------------------------------------

def hcl_value(value):
    """A value from python-hcl2, with its string literals decoded: python-hcl2 keeps them as
    written (quotes, escapes, $${ for a literal ${), and HCL's escapes are JSON's."""
    if isinstance(value, dict):
        return {hcl_value(k): hcl_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [hcl_value(v) for v in value]
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return json.loads(value).replace("$${", "${").replace("%%{", "%{")
    return value


def gce_instances(text: str) -> dict:
    options = hcl2.SerializationOptions(explicit_blocks=False, preserve_heredocs=False,
                                        with_comments=False)
    (resource,) = hcl_value(hcl2.loads(text, serialization_options=options))["resource"]
    return resource["google_compute_instance"]


def test_gce_terraform_makes_the_nodes_and_each_starts_the_docker_run_line(tmp_path):
    text = render_gce_terraform(SPEC)
    # HCL interpolates ${...} and runs %{...} in any string, heredocs too: the only one wanted is
    # the VM's index (the script's own ${ and %{ are written $${ and %%{).
    assert re.findall(r"(?<!\$)\$\{[^}]*\}|(?<!%)%\{[^}]*\}", text) == ["${count.index}"]
    (name, vm), = gce_instances(text).items()
    assert name == "gpt_ddp" and vm["count"] == SPEC.nodes
    assert vm["name"] == "gpt-ddp-${count.index}", "gpt-ddp-0 hosts the rendezvous"
    assert vm["machine_type"] == "a3-highgpu-8g"
    assert vm["guest_accelerator"] == [{"type": "nvidia-h100-80gb", "count": 8}]
    (disk,) = vm["boot_disk"]
    (params,) = disk["initialize_params"]
    assert params["image"].startswith("projects/deeplearning-platform-release/global/images/")
    assert params["type"] == "pd-balanced"
    (scheduling,) = vm["scheduling"]
    assert scheduling == {"on_host_maintenance": "TERMINATE", "automatic_restart": False,
                          "preemptible": True, "provisioning_model": "SPOT",
                          "instance_termination_action": "STOP"}
    assert vm["metadata"] == {"install-nvidia-driver": "True"}
    # The startup script, run by bash as GCE would on gpt-ddp-1, with stand-ins for the tools.
    script = tmp_path / "startup.sh"
    script.write_text(vm["metadata_startup_script"])
    calls = run_with_stand_ins(tmp_path, ["bash", str(script)], {})
    assert [c.split()[0] for c in calls] == ["nvidia-smi", "gcloud", "docker"]
    assert shlex.split(calls[1]) == ["gcloud", "auth", "configure-docker", "us-docker.pkg.dev",
                                     "--quiet"], "the VM pulls from the project's registry"
    args = docker_run_args(shlex.split(calls[2]))
    assert (args.image, args.gpus, args.shm_size, args.env) == (SPEC.image, "8", "16g",
                                                                 ENVIRONMENT)
    assert_runs_the_spec(torchrun_args(args.command), SPEC, "gpt-ddp-0:29500", "gpt-ddp")

    cpu = JobSpec(name="cpu-job", nodes=3, procs_per_node=4, script="t.py",
                  machine_type="c2-standard-8")
    (vm,) = gce_instances(render_gce_terraform(cpu)).values()
    assert "guest_accelerator" not in vm and vm["count"] == 3
    assert vm["scheduling"] == [{"on_host_maintenance": "MIGRATE", "automatic_restart": True,
                                 "preemptible": False, "provisioning_model": "STANDARD"}]
    assert "nvidia-smi" not in vm["metadata_startup_script"]
    assert "configure-docker" not in vm["metadata_startup_script"], "a public image"


# --- Checks: what the cloud would refuse, said before it does -----------------------------------

@pytest.mark.parametrize("change, message", [
    ({"machine_type": None}, "set machine_type"),
    ({"gpus_per_node": 4}, r"a3-highgpu-8g comes with 8 x nvidia-h100-80gb: set gpus_per_node=8, "
                           r"or machine_type='a3-highgpu-4g' for 4"),
    ({"accelerator": "nvidia-tesla-t4"}, "comes with nvidia-h100-80gb, not nvidia-tesla-t4"),
    ({"machine_type": "n1-standard-16"}, "n1 machine takes attached GPUs: set accelerator"),
    ({"machine_type": "n1-standard-16", "accelerator": "nvidia-tesla-t4"},
     r"attaches to n1 machines \(1, 2, 4\) at a time"),
    ({"machine_type": "e2-standard-8"}, "e2-standard-8 takes no GPUs"),
    ({"machine_type": "a3-highgpu-16g"}, "not in FIXED_GPU_MACHINES"),
    ({"max_restarts": 0}, "spot=True with max_restarts=0"),
])
@pytest.mark.parametrize("render", [render_vertex_job, render_gce_terraform])
def test_cloud_renderers_refuse_what_the_cloud_would_and_say_what_to_change(render, change,
                                                                              message):
    with pytest.raises(ValueError, match=message):
        render(dataclasses.replace(SPEC, **change))


def test_machine_types_carry_their_gpus():
    def gpus(machine_type, count, accelerator=None):
        return machine_gpus(JobSpec(name="m", nodes=1, procs_per_node=1, script="t.py",
                                    machine_type=machine_type, gpus_per_node=count,
                                    accelerator=accelerator))
    assert gpus("a3-highgpu-8g", 8) == ("nvidia-h100-80gb", 8)
    assert gpus("a2-ultragpu-4g", 4) == ("nvidia-a100-80gb", 4)
    assert gpus("g2-standard-24", 2) == ("nvidia-l4", 2)
    assert gpus("n1-standard-8", 4, "nvidia-tesla-v100") == ("nvidia-tesla-v100", 4)
    assert gpus("n1-standard-8", 0) is None and gpus("c3-standard-8", 0) is None
    with pytest.raises(ValueError, match="set gpus_per_node=1"):
        gpus("g2-standard-8", 0)


# --- One spec: the older renderers unchanged, the library free of the parsers -------------------

def test_new_fields_leave_sbatch_and_pytorchjob_as_they_were():
    plain = JobSpec(name="gpt-ddp", nodes=2, procs_per_node=8, script="/workspace/train.py",
                    gpus_per_node=8, image=SPEC.image, max_restarts=3)
    cloudy = dataclasses.replace(plain, machine_type="a3-highgpu-8g", spot=True,
                                 base_image=SPEC.base_image, accelerator="nvidia-h100-80gb")
    assert render_sbatch(cloudy) == render_sbatch(plain)
    assert render_pytorchjob(cloudy) == render_pytorchjob(plain)
    # shm_gb gives each pod a memory-backed /dev/shm (64 MiB otherwise).
    job = yaml.safe_load(render_pytorchjob(dataclasses.replace(plain, shm_gb=16)))
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "dshm",
                               "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    with pytest.raises(ValueError, match="shm_gb"):
        JobSpec(name="a", nodes=1, procs_per_node=1, script="t.py", shm_gb=0)


def test_gpulab_never_imports_the_test_parsers():
    imports = re.compile(r"^\s*(?:import|from)\s+(yaml|hcl2|dockerfile_parse)\b", re.MULTILINE)
    for path in (ROOT / "gpulab").rglob("*.py"):
        used = imports.findall(path.read_text())
        assert not used, f"{path.relative_to(ROOT)} imports {used}: a test-only dependency"
