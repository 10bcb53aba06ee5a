"""One job description, rendered for the schedulers multi-node training runs on: SLURM (an
sbatch script) and Kubernetes (a Kubeflow PyTorchJob). Both start on every node the torchrun
command that LocalCluster starts on this machine: c10d rendezvous, one agent per node.

    spec = JobSpec(name="gpt-ddp", nodes=4, procs_per_node=8, script="train.py",
                   args=("--steps", "1000"), image="nvcr.io/nvidia/pytorch:24.05-py3",
                   gpus_per_node=8)
    Path("gpt-ddp.sbatch").write_text(render_sbatch(spec))     # then: sbatch gpt-ddp.sbatch
    Path("gpt-ddp.yaml").write_text(render_pytorchjob(spec))   # then: kubectl apply -f ...

SLURM: one task per node runs torchrun (srun starts it on every node of the allocation); the
rendezvous is hosted by the allocation's first node (the first line of `scontrol show hostnames
"$SLURM_JOB_NODELIST"`, read with awk, which reads to the end: `head -n 1` would close the pipe
early, and under `set -o pipefail` scontrol's SIGPIPE fails the job), and the job id names the
rendezvous.
Kubeflow (training-operator, kubeflow.org/v1): a Master replica and nodes - 1 Worker replicas,
each a pod whose container must be named "pytorch"; the operator gives the Master pod a Service
named <name>-master-0, which hosts the rendezvous on the port named "pytorchjob-port".
spec.nprocPerNode is a string in that API; elasticPolicy appears when min_nodes is set
(torchrun --nnodes min:max); shm_gb mounts a memory-backed /dev/shm (a pod's default is 64 MiB,
too small for DataLoader workers). The YAML is written by hand (block style, strings
JSON-quoted, which YAML reads as they are), so gpulab needs no YAML library.
Preemption (see runtime/notice.py): grace_period_s is the warning a job gets before it is
stopped, the time to save a checkpoint. SLURM sends notice_signal (USR1) that long before the
time limit to every process of the job's steps (`--signal=USR1@S`, without "B:", which would
signal only the batch shell: SLURM may send it up to 60 s earlier than asked); Kubernetes sends
SIGTERM to the container and SIGKILL grace_period_s later (terminationGracePeriodSeconds, 30 s
by default). torchrun is told both: --signals-to-handle adds the signal to the four it passes on
to its workers (an unhandled SIGUSR1 would kill it), and --shutdown-timeout makes it wait as long
before its own SIGKILL (30 s by default). requeues: a run that ended early (the notice's
checkpoint is on disk) is queued again with the same job id, at most that many times, so that
a real bug does not come back forever: SLURM's `--requeue` and a `scontrol requeue` after a
failed srun (torchrun exits with 1 whatever code its workers chose, so the script cannot see
REQUEUE_EXIT_CODE itself), and a PyTorchJob's runPolicy.backoffLimit with restartPolicy
OnFailure (which restarts a pod on any code but 0; ExitCode would count 75 as permanent, since
Kubeflow retries only codes of 128 and up).
The same JobSpec is rendered for containers and Google Cloud (a Dockerfile, `docker run`, a
Vertex AI CustomJob, GCE VMs in Terraform) by cloud_templates.py, which alone reads the last
fields of JobSpec.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (multi-node launch)
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

_K8S_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # a DNS-1035 label: Service names
TORCHRUN_HANDLED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's default


@dataclass(frozen=True)
class JobSpec:
    """A multi-node training job, independent of the scheduler that runs it."""

    name: str  # job name: SLURM --job-name, PyTorchJob metadata.name (a-z, 0-9, '-')
    nodes: int  # machines: SLURM nodes, Kubernetes pods (the largest count when elastic)
    procs_per_node: int  # torchrun processes per node, usually one per GPU
    script: str  # the training script's path on the nodes (shared file system or image)
    args: tuple[str, ...] = ()  # the script's arguments
    image: str = "pytorch/pytorch:latest"  # the container image: PyTorchJob, Vertex AI, docker
    gpus_per_node: int = 0  # GPUs per node: --gpus-per-node, nvidia.com/gpu
    cpus_per_node: int | None = None  # CPU cores per node, None: the scheduler's default
    memory_gb: int | None = None  # memory per node in GiB, None: the scheduler's default
    time_limit: str = "01:00:00"  # wall clock (HH:MM:SS): SLURM --time, Vertex AI timeout
    partition: str | None = None  # SLURM partition, None: the cluster's default
    max_restarts: int = 0  # torchrun --max-restarts: worker-group restarts after a failure
    min_nodes: int | None = None  # elastic: run on min_nodes..nodes nodes (None: exactly nodes)
    rdzv_port: int = 29500  # the rendezvous port on the first node / the Master pod
    env: tuple[tuple[str, str], ...] = ()  # extra environment, as (name, value) pairs
    shm_gb: int | None = None  # /dev/shm per node, GiB (DataLoader workers); None: --ipc=host
    grace_period_s: int | None = None  # notice before a stop, s; None: the platforms' defaults
    notice_signal: str = "USR1"  # what SLURM sends grace_period_s before the time limit
    requeues: int = 0  # times a run that ended early is queued again (0: never)
    # Read by cloud_templates.py alone:
    base_image: str | None = None  # the Dockerfile's FROM (a CUDA build of PyTorch); builds image
    machine_type: str | None = None  # GCE / Vertex AI machine type, e.g. "a3-highgpu-8g"
    accelerator: str | None = None  # an n1 machine's GPU ("nvidia-tesla-t4"); else the type's own
    spot: bool = False  # spot VMs (GCE, Vertex AI): cheaper, stopped when the cloud needs them

    def __post_init__(self):
        if isinstance(self.env, Mapping):  # a dict is accepted, kept as pairs (hashable)
            object.__setattr__(self, "env", tuple(self.env.items()))
        object.__setattr__(self, "args", tuple(map(str, self.args)))
        if not (_K8S_NAME.match(self.name) and len(self.name) <= 50):
            raise ValueError(f"name {self.name!r}: use lowercase letters, digits and '-', start "
                             "with a letter, at most 50 characters (Kubernetes adds suffixes)")
        if self.nodes < 1 or self.procs_per_node < 1 or self.gpus_per_node < 0:
            raise ValueError("need nodes >= 1, procs_per_node >= 1 and gpus_per_node >= 0")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise ValueError(f"min_nodes must be between 1 and nodes={self.nodes}, "
                             f"got {self.min_nodes}")
        if not re.fullmatch(r"\d+:\d\d:\d\d", self.time_limit):
            raise ValueError(f"time_limit must look like HH:MM:SS, got {self.time_limit!r}")
        if self.shm_gb is not None and self.shm_gb < 1:
            raise ValueError(f"shm_gb is in GiB and at least 1, got {self.shm_gb}")
        if self.grace_period_s is not None and not 0 < self.grace_period_s <= 65535:
            raise ValueError("grace_period_s is in seconds, 1 to 65535 (SLURM's limit), got "
                             f"{self.grace_period_s}")
        if not re.fullmatch(r"[A-Z][A-Z0-9]*", self.notice_signal) or \
                self.notice_signal.startswith("SIG"):
            raise ValueError(f"notice_signal is a signal's name without SIG, as SLURM writes it "
                             f"(\"USR1\"), got {self.notice_signal!r}")
        if self.requeues < 0:
            raise ValueError(f"requeues must be at least 0, got {self.requeues}")

    @property
    def nnodes(self) -> str:
        """torchrun's --nnodes: "4", or "2:4" when elastic."""
        return f"{self.min_nodes}:{self.nodes}" if self.min_nodes else str(self.nodes)

    def environment(self) -> list[tuple[str, str]]:
        """`env`, plus what torchrun's restarts need: a fresh rendezvous store per attempt
        (the shared one keeps the last attempt's keys: pytorch/pytorch#135712)."""
        extra = [("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")] if self.max_restarts else []
        return [*self.env, *extra]

    @property
    def world_size(self) -> int:
        """Processes in the whole job (at full size when elastic)."""
        return self.nodes * self.procs_per_node

    def torchrun_command(self, endpoint: str | None, rdzv_id: str) -> list[str]:
        """The command every node runs, as a list of words. endpoint None leaves the flag out:
        torchrun then reads it from PET_RDZV_ENDPOINT, as it reads any flag from PET_<FLAG>."""
        where = [f"--rdzv-endpoint={endpoint}"] if endpoint is not None else []
        return ["torchrun", f"--nnodes={self.nnodes}", f"--nproc-per-node={self.procs_per_node}",
                "--rdzv-backend=c10d", *where, f"--rdzv-id={rdzv_id}",
                f"--max-restarts={self.max_restarts}", *self.notice_flags(), self.script,
                *self.args]

    def notice_flags(self) -> list[str]:
        """torchrun's flags for a notice: pass notice_signal on to the workers as well as the
        four it passes by default, and wait grace_period_s for them before its SIGKILL."""
        if self.grace_period_s is None:
            return []
        handled = [*TORCHRUN_HANDLED_SIGNALS]
        if f"SIG{self.notice_signal}" not in handled:
            handled.append(f"SIG{self.notice_signal}")
        return [f"--signals-to-handle={','.join(handled)}",
                f"--shutdown-timeout={self.grace_period_s}"]

    def torchrun_shell_words(self, endpoint: str, rdzv_id: str) -> list[str]:
        """torchrun_command for a shell script: every word quoted by shlex, except the endpoint
        and the id, which go in double quotes so the node's shell expands the variables in
        them ("${head_node}:29500")."""
        words = [shlex.quote(w) for w in self.torchrun_command("ENDPOINT", "RDZV_ID")]
        words[words.index("--rdzv-endpoint=ENDPOINT")] = f'--rdzv-endpoint="{endpoint}"'
        words[words.index("--rdzv-id=RDZV_ID")] = f'--rdzv-id="{rdzv_id}"'
        return words


def render_sbatch(spec: JobSpec) -> str:
    """An sbatch script: #SBATCH resources, then `srun torchrun ...` once per node."""
    nodes = f"{spec.min_nodes}-{spec.nodes}" if spec.min_nodes else str(spec.nodes)
    directives = [f"--job-name={spec.name}", f"--nodes={nodes}",
                  "--ntasks-per-node=1",  # one torchrun agent per node; it starts the workers
                  f"--time={spec.time_limit}", f"--output={spec.name}-%j.out"]
    if spec.gpus_per_node:
        directives.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.cpus_per_node:
        directives.append(f"--cpus-per-task={spec.cpus_per_node}")  # the one task per node
    if spec.memory_gb:
        directives.append(f"--mem={spec.memory_gb}G")
    if spec.partition:
        directives.append(f"--partition={spec.partition}")
    if spec.grace_period_s is not None:  # every process of the steps: the ranks, torchrun
        directives.append(f"--signal={spec.notice_signal}@{spec.grace_period_s}")
    if spec.requeues:  # a requeued job appends to its output file instead of emptying it
        directives += ["--requeue", "--open-mode=append"]
    # The shell on the batch host expands the endpoint and the id.
    words = spec.torchrun_shell_words(f"${{head_node}}:{spec.rdzv_port}", "${SLURM_JOB_ID}")
    program = len(words) - 1 - len(spec.args)  # one line per torchrun flag, then the script
    command = " \\\n    ".join([*words[:program], " ".join(words[program:])])
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives), "", "set -euo pipefail"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in spec.environment()]
    lines += ["", "# The allocation's first node hosts the c10d rendezvous.",
              'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk \'NR == 1\')',
              ""]
    if not spec.requeues:
        return "\n".join([*lines, f"srun {command}", ""])
    return "\n".join([*lines, "status=0", f"srun {command} || status=$?", "",
                      "# Ended early (after a notice, its checkpoint saved): queue the job again,",
                      f"# which starts this script from the top, at most {spec.requeues} times.",
                      'if [ "$status" -ne 0 ] && '
                      f'[ "${{SLURM_RESTART_COUNT:-0}}" -lt {spec.requeues} ]; then',
                      '    scontrol requeue "$SLURM_JOB_ID"', "fi", 'exit "$status"', ""])


def pytorchjob(spec: JobSpec) -> dict:
    """The Kubeflow PyTorchJob (kubeflow.org/v1) for `spec`, as a dict."""
    endpoint = f"{spec.name}-master-0:{spec.rdzv_port}"
    limits: dict[str, object] = {}
    if spec.gpus_per_node:
        limits["nvidia.com/gpu"] = spec.gpus_per_node
    if spec.cpus_per_node:
        limits["cpu"] = spec.cpus_per_node
    if spec.memory_gb:
        limits["memory"] = f"{spec.memory_gb}Gi"
    container = {"name": "pytorch",  # the operator looks for this name
                 "image": spec.image, "command": spec.torchrun_command(endpoint, spec.name),
                 "ports": [{"name": "pytorchjob-port", "containerPort": spec.rdzv_port}]}
    if spec.environment():
        container["env"] = [{"name": n, "value": v} for n, v in spec.environment()]
    if limits:
        container["resources"] = {"limits": limits}
    pod: dict[str, object] = {"containers": [container]}
    if spec.grace_period_s is not None:  # SIGTERM, then SIGKILL this long after
        pod["terminationGracePeriodSeconds"] = spec.grace_period_s
    if spec.shm_gb:  # a memory-backed volume over /dev/shm, which is 64 MiB in a pod
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        pod["volumes"] = [{"name": "dshm",
                           "emptyDir": {"medium": "Memory", "sizeLimit": f"{spec.shm_gb}Gi"}}]

    def replicas(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": pod}}

    replica_specs = {"Master": replicas(1)}
    if spec.nodes > 1:
        replica_specs["Worker"] = replicas(spec.nodes - 1)
    job_spec: dict[str, object] = {"nprocPerNode": str(spec.procs_per_node)}
    if spec.min_nodes:
        job_spec["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": spec.min_nodes,
                                     "maxReplicas": spec.nodes, "maxRestarts": spec.max_restarts}
    if spec.requeues:  # OnFailure restarts a pod on any code but 0, this many times
        job_spec["runPolicy"] = {"backoffLimit": spec.requeues}
    job_spec["pytorchReplicaSpecs"] = replica_specs
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": spec.name}, "spec": job_spec}


def render_pytorchjob(spec: JobSpec) -> str:
    """pytorchjob(spec) as YAML, ready for `kubectl apply -f`."""
    return to_yaml(pytorchjob(spec))


def to_yaml(value) -> str:
    """Block-style YAML for dicts, lists, strings, ints and booleans (enough for a manifest)."""
    lines: list[str] = []
    _emit(value, 0, lines)
    return "\n".join(lines) + "\n"


def _emit(value, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{_key(key)}:")
                _emit(item, indent + 2, lines)
            else:
                lines.append(f"{pad}{_key(key)}: {_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                block: list[str] = []
                _emit(item, indent + 2, block)
                lines.append(f"{pad}- {block[0].lstrip()}")  # the first key shares the dash line
                lines += block[1:]
            elif isinstance(item, list) and item:
                raise TypeError("nested lists are not needed in a manifest")
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(f"{pad}{_scalar(value)}")


_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}  # not strings


def _key(key: str) -> str:
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./-]*", key) and key.lower() not in _YAML_WORDS
    return key if plain else json.dumps(key)


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(str(value))  # a JSON string is a YAML double-quoted scalar
