"""The JobSpec of job_templates.py, rendered for containers and Google Cloud: a Dockerfile, a
`docker run` line, a Vertex AI CustomJob and GCE VMs in Terraform. Each starts on every node the
torchrun command that render_sbatch and render_pytorchjob start (JobSpec.torchrun_command).

    spec = JobSpec(name="gpt-ddp", nodes=2, procs_per_node=8, gpus_per_node=8,
                   script="/workspace/train.py", args=("--steps", "1000"), max_restarts=3,
                   image="us-docker.pkg.dev/my-project/train/gpt-ddp:1", shm_gb=16,
                   base_image="nvcr.io/nvidia/pytorch:24.05-py3",
                   machine_type="a3-highgpu-8g", spot=True)
    Path("Dockerfile").write_text(render_dockerfile(spec))
        # then, beside train.py: docker build -t <image> . && docker push <image>
    print(render_docker_run(spec, head_node="10.0.0.2"))     # paste it on every node
    Path("gpt-ddp.vertex.yaml").write_text(render_vertex_job(spec))
        # then: gcloud ai custom-jobs create --region=us-central1 --display-name=gpt-ddp \
        #           --config=gpt-ddp.vertex.yaml
    Path("main.tf").write_text(render_gce_terraform(spec))
        # then: GOOGLE_PROJECT=... GOOGLE_ZONE=us-central1-a terraform init && terraform apply

What lives where: the host has the NVIDIA driver and the container toolkit (which `--gpus`
needs); the image has CUDA, PyTorch and the script, and its CUDA must be one the driver supports.

Dockerfile     builds `image` FROM base_image: the script copied to spec.script, the environment
               as ENV, and as CMD the torchrun command without --rdzv-endpoint. torchrun reads a
               flag it is not given from PET_<FLAG>, so `docker run -e PET_RDZV_ENDPOINT=<first
               node>:29500 <image>` starts a node (the Kubeflow operator uses the same variables).
docker run     one node's line: --gpus, --ipc=host (or --shm-size when shm_gb is set),
               --network=host (NCCL and the rendezvous reach the other nodes on the hosts' own
               addresses), -e per variable, then the whole torchrun command.
Vertex AI      a CustomJobSpec, as `gcloud ai custom-jobs create --config` reads it: worker pool 0
               is the primary replica (replicaCount 1), pool 1 the other nodes - 1, each with the
               same machineSpec and container. Vertex AI sets MASTER_ADDR and MASTER_PORT on
               every replica to the primary's, so the command runs under `bash -c` to expand
               them. time_limit is scheduling.timeout; spot is scheduling.strategy SPOT. The API
               has no /dev/shm setting.
GCE Terraform  `count = nodes` google_compute_instance VMs named <name>-0, <name>-1, ... from a
               Deep Learning VM image (driver, Docker, container toolkit), each running the docker
               run line at boot with <name>-0 as the head node (GCE's internal DNS resolves
               instance names; the default network lets instances reach each other). GPUs cannot
               live-migrate, hence on_host_maintenance = "TERMINATE"; a spot VM also needs
               automatic_restart = false, and is stopped when reclaimed: started again, it reruns
               the startup script and rejoins the rendezvous.

Machine types: the A and G series (a2, a3, a4, g2) come with a fixed number of one GPU model, and
the renderers check gpus_per_node against it; n1 machines take attached GPUs (accelerator); the
rest take none. A spot job needs max_restarts >= 1, or the first reclaimed node ends it.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (containers and clouds)
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import PurePosixPath

from gpulab.distributed.job_templates import JobSpec, to_yaml

# A Deep Learning VM image family: CUDA 12.9, NVIDIA driver 580, Docker and the container toolkit.
DLVM_IMAGE = ("projects/deeplearning-platform-release/global/images/family/"
              "common-cu129-ubuntu-2404-nvidia-580")
BOOT_DISK_GB = 200  # the VM image, a PyTorch container image (tens of GB) and checkpoints

# GCE machine types that come with their GPUs: type -> (GPU, count), GCE's names.
FIXED_GPU_MACHINES: dict[str, tuple[str, int]] = {
    **{f"a2-highgpu-{n}g": ("nvidia-tesla-a100", n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("nvidia-tesla-a100", 16),
    **{f"a2-ultragpu-{n}g": ("nvidia-a100-80gb", n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": ("nvidia-h100-80gb", n) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
    "a4-highgpu-8g": ("nvidia-b200", 8),
    **{f"g2-standard-{cpus}": ("nvidia-l4", 1) for cpus in (4, 8, 12, 16, 32)},
    "g2-standard-24": ("nvidia-l4", 2),
    "g2-standard-48": ("nvidia-l4", 4),
    "g2-standard-96": ("nvidia-l4", 8),
}
# GPUs that attach to an n1 machine, and the counts each comes in.
N1_GPUS: dict[str, tuple[int, ...]] = {
    "nvidia-tesla-t4": (1, 2, 4),
    "nvidia-tesla-v100": (1, 2, 4, 8),
    "nvidia-tesla-p100": (1, 2, 4),
    "nvidia-tesla-p4": (1, 2, 4),
}


def machine_gpus(spec: JobSpec) -> tuple[str, int] | None:
    """(GPU, count) on each of spec's cloud machines, in GCE's names; None: no GPU. Raises
    ValueError, saying what to change, for what GCE or Vertex AI would refuse."""
    machine, gpus = spec.machine_type, spec.gpus_per_node
    if not machine:
        raise ValueError("set machine_type, the cloud machine of each node: for example "
                         "'a3-highgpu-8g' (8 x H100) or 'g2-standard-8' (1 x L4)")
    if machine in FIXED_GPU_MACHINES:
        gpu, count = FIXED_GPU_MACHINES[machine]
        if spec.accelerator not in (None, gpu):
            raise ValueError(f"{machine} comes with {gpu}, not {spec.accelerator}: leave "
                             "accelerator unset, or pick a machine type that has that GPU")
        if gpus != count:
            fits = [m for m, (g, n) in FIXED_GPU_MACHINES.items() if g == gpu and n == gpus]
            other = f", or machine_type={fits[0]!r} for {gpus}" if fits else ""
            raise ValueError(f"{machine} comes with {count} x {gpu}: set gpus_per_node={count}"
                             f"{other}")
        return gpu, count
    if machine.startswith("n1-"):
        if not gpus and not spec.accelerator:
            return None
        if spec.accelerator not in N1_GPUS:
            raise ValueError(f"an n1 machine takes attached GPUs: set accelerator to one of "
                             f"{sorted(N1_GPUS)}, got {spec.accelerator!r}")
        counts = N1_GPUS[spec.accelerator]
        if gpus not in counts:
            raise ValueError(f"{spec.accelerator} attaches to n1 machines {counts} at a time: "
                             f"set gpus_per_node to one of them, got {gpus}")
        return spec.accelerator, gpus
    if re.match(r"[ag]\d+-", machine):
        raise ValueError(f"{machine!r} is not in FIXED_GPU_MACHINES: check the name (gcloud "
                         "compute machine-types list), or add it with its GPU and count")
    if gpus or spec.accelerator:
        raise ValueError(f"{machine} takes no GPUs: use an A or G series machine type (GPUs "
                         "included, e.g. 'a3-highgpu-8g') or n1 with accelerator")
    return None


def _check_spot(spec: JobSpec) -> None:
    if spec.spot and spec.max_restarts < 1:
        raise ValueError("spot=True with max_restarts=0: the first reclaimed node would end the "
                         "job. Set max_restarts (e.g. 3) so torchrun forms the group again when "
                         "the node is back, and have the script resume from its checkpoint")


def render_dockerfile(spec: JobSpec) -> str:
    """A Dockerfile that builds spec.image: base_image, the script, the environment, torchrun."""
    if not spec.base_image:
        raise ValueError("set base_image, the CUDA build of PyTorch the image starts FROM: for "
                         "example 'nvcr.io/nvidia/pytorch:24.05-py3' or "
                         "'pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime'")
    source = PurePosixPath(spec.script).name
    lines = [f"# Builds {spec.image}: docker build -t {spec.image} <folder with {source}>",
             f"FROM {spec.base_image}", "WORKDIR /workspace",
             f"COPY {json.dumps([source, spec.script])}"]
    lines += [f"ENV {name}={_env_word(value)}" for name, value in spec.environment()]
    lines += ["# torchrun reads a flag it is not given from PET_<FLAG>; on each node:",
              f"#   docker run -e PET_RDZV_ENDPOINT=<first node>:{spec.rdzv_port} ... {spec.image}",
              f"ENV PET_RDZV_ENDPOINT=localhost:{spec.rdzv_port}",
              f"CMD {json.dumps(spec.torchrun_command(None, spec.name))}", ""]
    return "\n".join(lines)


def _env_word(value: str) -> str:
    """An ENV value quoted as for a shell, which Docker reads the same way: in single quotes,
    $ and backslashes stay as they are."""
    if "\n" in value:
        raise ValueError(f"an ENV value cannot hold a newline: {value!r}")
    return shlex.quote(value)


def render_docker_run(spec: JobSpec, head_node: str | None = None) -> str:
    """One node's `docker run` line, quoted for a shell. head_node: the address of the first
    node, which hosts the rendezvous (every node runs the same line); needed when nodes > 1."""
    if head_node is None:
        if spec.nodes > 1:
            raise ValueError(f"{spec.nodes} nodes: pass head_node, the address of the first "
                             "node, which hosts the rendezvous (the same on every node)")
        head_node = "localhost"
    flags = ["--rm", "--network=host"]
    if spec.gpus_per_node:
        flags.append(f"--gpus={spec.gpus_per_node}")
    flags.append(f"--shm-size={spec.shm_gb}g" if spec.shm_gb else "--ipc=host")
    for name, value in spec.environment():
        flags += ["-e", f"{name}={value}"]
    command = spec.torchrun_command(f"{head_node}:{spec.rdzv_port}", spec.name)
    return shlex.join(["docker", "run", *flags, spec.image, *command])


def vertex_accelerator(gpu: str) -> str:
    """Vertex AI's name for a GCE GPU: nvidia-h100-80gb -> NVIDIA_H100_80GB."""
    return gpu.upper().replace("-", "_")


def vertex_job(spec: JobSpec) -> dict:
    """The Vertex AI CustomJobSpec for `spec`, as a dict."""
    _check_spot(spec)
    gpu = machine_gpus(spec)
    machine: dict[str, object] = {"machineType": spec.machine_type}
    if gpu:
        machine |= {"acceleratorType": vertex_accelerator(gpu[0]), "acceleratorCount": gpu[1]}
    words = spec.torchrun_shell_words("${MASTER_ADDR}:${MASTER_PORT}", spec.name)
    container: dict[str, object] = {"imageUri": spec.image,
                                    "command": ["bash", "-c", " ".join(["exec", *words])]}
    if spec.environment():
        container["env"] = [{"name": n, "value": v} for n, v in spec.environment()]
    pools = [{"machineSpec": machine, "replicaCount": count, "containerSpec": container}
             for count in (1, spec.nodes - 1) if count]
    hours, minutes, seconds = map(int, spec.time_limit.split(":"))
    scheduling: dict[str, object] = {"timeout": f"{hours * 3600 + minutes * 60 + seconds}s"}
    if spec.spot:
        scheduling["strategy"] = "SPOT"
    return {"workerPoolSpecs": pools, "scheduling": scheduling}


def render_vertex_job(spec: JobSpec) -> str:
    """vertex_job(spec) as YAML, for `gcloud ai custom-jobs create --config`."""
    return to_yaml(vertex_job(spec))


def render_gce_terraform(spec: JobSpec, boot_image: str = DLVM_IMAGE) -> str:
    """`nodes` GCE VMs in Terraform, each running render_docker_run's line at boot."""
    _check_spot(spec)
    gpu = machine_gpus(spec)
    run = render_docker_run(spec, head_node=f"{spec.name}-0")
    script = ["#!/bin/bash",
              "# Runs as root at every boot: a spot VM started again rejoins the job.",
              "set -euo pipefail"]
    if gpu:
        script.append("until nvidia-smi > /dev/null 2>&1; do sleep 10; done  # driver ready")
    registry = spec.image.split("/")[0]
    if registry.endswith((".pkg.dev", "gcr.io")):  # the project's registry: use the VM's account
        script.append(f"gcloud auth configure-docker {registry} --quiet")
    script.append(run)

    restart = "false" if spec.spot else "true"  # spot VMs cannot restart themselves
    lines = [f"# {spec.name}: {spec.nodes} x {spec.machine_type}"
             + (f", {gpu[1]} x {gpu[0]} each" if gpu else "") + (", spot" if spec.spot else ""),
             "# terraform apply, with the google provider's project and zone (GOOGLE_PROJECT, "
             "GOOGLE_ZONE) set",
             f'resource "google_compute_instance" "{spec.name.replace("-", "_")}" {{',
             f"  count        = {spec.nodes}",
             f'  name         = "{spec.name}-${{count.index}}"',
             f"  machine_type = {_hcl(spec.machine_type)}", "",
             "  boot_disk {", "    initialize_params {",
             f"      image = {_hcl(boot_image)}",
             f"      size  = {BOOT_DISK_GB}",
             '      type  = "pd-balanced"',  # A3 and G2 take no pd-standard
             "    }", "  }", ""]
    if gpu:
        lines += ["  guest_accelerator {", f"    type  = {_hcl(gpu[0])}",
                  f"    count = {gpu[1]}", "  }", ""]
    maintenance = "TERMINATE" if gpu or spec.spot else "MIGRATE"  # GPUs cannot live-migrate
    lines += ["  scheduling {",
              f'    on_host_maintenance         = "{maintenance}"',
              f"    automatic_restart           = {restart}",
              f"    preemptible                 = {'true' if spec.spot else 'false'}",
              f'    provisioning_model          = "{"SPOT" if spec.spot else "STANDARD"}"']
    if spec.spot:
        lines.append('    instance_termination_action = "STOP"')  # keep the disk
    lines += ["  }", "",
              "  network_interface {", '    network  = "default"',
              '    nic_type = "GVNIC"',  # A3 requires gVNIC; the other GPU machines take it
              "    access_config {}",  # an external address: the driver and the image download
              "  }", "",
              "  service_account {", '    scopes = ["cloud-platform"]', "  }", "",
              "  metadata = {", '    install-nvidia-driver = "True"', "  }", "",
              "  metadata_startup_script = <<-EOT",
              *(f"    {_hcl_template(line)}" for line in script),
              "  EOT", "}", ""]
    return "\n".join(lines)


def _hcl(value: str) -> str:
    """A quoted HCL string: JSON's escapes, and ${ and %{ doubled so they stay literal."""
    return _hcl_template(json.dumps(value))


def _hcl_template(text: str) -> str:
    return text.replace("${", "$${").replace("%{", "%%{")
