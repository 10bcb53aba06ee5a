"""LocalCluster: N nodes x M processes under torchrun, joined by a c10d rendezvous, each node in
its own network namespace where the machine allows it; a training run that survives a killed
worker; a node given a preemption notice; SLURM and Kubeflow job files rendered from one JobSpec,
with and without a grace period and requeues.

A cluster launch costs seconds (every node's agent imports torch, and so does each node's rank
server), so each test checks several things per launch. The netns tests need root and
iproute2's `ip` and skip themselves elsewhere. Every test that starts a cluster checks that
nothing is left behind: no process, no namespace, no link in the host's namespace.
"""

import dataclasses
import json
import logging
import os
import re
import shlex
import signal
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import torch.distributed.run as torch_run
import yaml

from gpulab.distributed import (
    REQUEUE_EXIT_CODE,
    TRAIN_SCRIPT,
    JobSpec,
    LaunchTimeout,
    LocalCluster,
    NetnsError,
    Notice,
    pytorchjob,
    render_pytorchjob,
    render_sbatch,
)
from gpulab.distributed.job_templates import to_yaml
from gpulab.distributed.runtime import cluster as cluster_module
from gpulab.distributed.runtime import netns
from gpulab.distributed.runtime.processes import OutputForwarder

pytestmark = pytest.mark.dist
OURS = f"{netns.PREFIX}{os.getpid()}-"  # the namespaces this test process makes


def _netns_unavailable() -> str | None:
    """Why this machine cannot make network namespaces (a real try), or None."""
    reason = netns.unavailable_reason()
    if reason:
        return reason
    try:
        netns.NetnsTopology.create(1).destroy()
    except netns.NetnsError as error:  # e.g. root in a container without CAP_SYS_ADMIN
        return str(error)
    return None


NETNS_UNAVAILABLE = _netns_unavailable()
needs_netns = pytest.mark.skipif(NETNS_UNAVAILABLE is not None,
                                 reason=f"needs network namespaces: {NETNS_UNAVAILABLE}")


def _host_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


@pytest.fixture
def nothing_left_behind():
    """Fails the test if a cluster left a process, a namespace or a host link behind."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    links = _host_links() if NETNS_UNAVAILABLE is None else set()
    yield
    alive = [p for p in psutil.Process().children(recursive=True)
             if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left behind: {[(p.pid, p.cmdline()[:6]) for p in alive]}"
    if NETNS_UNAVAILABLE is None:
        left = [name for name in netns.list_namespaces() if name.startswith(OURS)]
        assert not left, f"network namespaces left behind: {left}"
        # A cluster's links are br0, node<i> and veth0, all inside its namespaces; other
        # programs on this machine may add links of their own meanwhile.
        ours = {name for name in _host_links() - links
                if name in ("br0", "veth0") or name.split("@")[0].startswith("node")}
        assert not ours, f"links left in the host's namespace: {ours}"


ALL_REDUCE = """
import json, os, socket
import torch, torch.distributed as dist

dist.init_process_group("gloo")
t = torch.full((1 << 20,), float(dist.get_rank() + 1))  # 4 MiB of float32
dist.all_reduce(t)
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # UDP connect sends nothing: it only
probe.connect((os.environ["MASTER_ADDR"], 9))             # picks the source address to use
print("report " + json.dumps({
    "rank": dist.get_rank(), "world_size": dist.get_world_size(),
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
    "address": probe.getsockname()[0], "ifname": os.environ["GLOO_SOCKET_IFNAME"],
    "sum": t.sum().item() / t.numel()}), flush=True)
dist.destroy_process_group()
"""
PAYLOAD_BYTES = (1 << 20) * 4


def _reports(text: str) -> list[dict]:
    return [json.loads(line.partition("report ")[2]) for line in text.splitlines()
            if "report {" in line]


@needs_netns
def test_nodes_talk_over_their_own_interface(tmp_path, nothing_left_behind):
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    with LocalCluster(nodes=2, procs_per_node=2, isolation="netns", echo=False) as cluster:
        names = cluster.topology.namespaces
        assert cluster.isolation == "netns" and set(names) <= set(netns.list_namespaces())
        before = cluster.traffic()
        result = cluster.run(script, timeout_s=60)
        after = cluster.traffic()
    assert result.ok, result.error
    assert result.isolation == "netns" and result.attempts == 1
    assert cluster.addresses == ["10.213.0.1", "10.213.0.2"]
    ranks = set()
    for node in result.nodes:
        reports = _reports(node.stdout)
        assert len(reports) == 2, f"node {node.node_rank} should run 2 ranks:\n{node.stdout}"
        for report in reports:
            ranks.add(report["rank"])
            assert report["world_size"] == 4 and report["sum"] == 1 + 2 + 3 + 4
            assert report["interfaces"] == ["lo", "veth0"], "each rank runs inside its node"
            assert report["ifname"] == "veth0"
            assert report["address"] == node.address, "a node's ranks use the node's address"
    assert ranks == {0, 1, 2, 3}
    # Neither node can finish the all-reduce without receiving the other node's partial sum
    # (a whole tensor; gloo does not compress) and sending its own: at least PAYLOAD_BYTES each
    # way on every veth0. (Ranks on one node talk over the node's lo, which is not counted.)
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        assert a.rx_bytes - b.rx_bytes >= PAYLOAD_BYTES, f"node {i} received too little: {a}"
        assert a.tx_bytes - b.tx_bytes >= PAYLOAD_BYTES, f"node {i} sent too little: {a}"
    assert not set(names) & set(netns.list_namespaces()), "the namespaces are deleted on exit"


PARENT = """
import json, os
import psutil
import torch.distributed as dist

dist.init_process_group("gloo")
parent = psutil.Process(os.getppid())
print("report " + json.dumps({
    "rank": dist.get_rank(), "parent": parent.pid,
    "forked": "nodeserver" in parent.cmdline(),  # bootstrap.py's role argument
    "server_children": len(parent.children()),  # this rank and its node's torchrun agent
    "fsdp_warm": "torch.distributed.fsdp" in __import__("sys").modules,
    "seen": os.environ.get("SEEN", "")}), flush=True)
dist.destroy_process_group()
"""


def test_ranks_are_forked_from_a_server_per_node_kept_while_the_environment_is(
        tmp_path, monkeypatch, nothing_left_behind):
    """A node's torchrun agent and ranks are forked from its warm server
    (gpulab/distributed/runtime/nodeserver.py), which imported FSDP already; the servers serve
    the next run, unless its environment differs. With GPULAB_FRESH_RANKS=1 each rank starts as
    a fresh interpreter under torchrun."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)

    def parents(result, world_size=2):
        assert result.ok, result.error
        found = {r["rank"]: r for node in result.nodes for r in _reports(node.stdout)}
        assert sorted(found) == list(range(world_size)), result.nodes
        return found

    with LocalCluster(nodes=2, procs_per_node=1, isolation="loopback", echo=False) as cluster:
        first = parents(cluster.run(script, timeout_s=60))
        # pytest names the next test in the environment: nothing the servers imported reads it
        again = parents(cluster.run(script, env={"PYTEST_CURRENT_TEST": "tests/next.py::t (call)"},
                                    timeout_s=60))
        other = parents(cluster.run(script, env={"SEEN": "yes"}, timeout_s=60))
    assert all(r["forked"] and r["fsdp_warm"] for r in (*first.values(), *other.values()))
    assert {r["server_children"] for r in first.values()} == {2}, "the agent is forked too"
    assert {r["parent"] for r in first.values()} == {r["parent"] for r in again.values()}
    assert len({r["parent"] for r in first.values()}) == 2, "one server per node"
    assert not {r["parent"] for r in first.values()} & {r["parent"] for r in other.values()}
    assert {r["seen"] for r in other.values()} == {"yes"}, "the rank has the run's environment"
    monkeypatch.setenv("GPULAB_FRESH_RANKS", "1")
    with LocalCluster(nodes=1, procs_per_node=1, isolation="loopback", echo=False) as cluster:
        (fresh,) = parents(cluster.run(script, timeout_s=60), world_size=1).values()
    assert not fresh["forked"] and not fresh["fsdp_warm"]


NOTICED = """
import signal, sys, time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
ignore = sys.argv[1] == "ignore"
got = []
for name in ("SIGTERM", "SIGUSR1"):
    signal.signal(getattr(signal, name), signal.SIG_IGN if ignore else lambda s, f: got.append(s))
for step in range(400):  # 20 s at most: a notice must come
    stop = torch.tensor([float(len(got))])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step boundary
    if stop.item():
        print(f"stopping at step {step}, signals here {len(got)}", flush=True)
        sys.exit({REQUEUE_EXIT_CODE})
    print(f"step {step}" + (" ready" if step >= 3 else ""), flush=True)
    time.sleep(0.05)
"""


def _signals_seen(node) -> dict[int, int]:
    """{rank: signals it got} from the ranks' "stopping" lines of one node."""
    found = re.findall(r"\[rank (\d+)\] stopping at step \d+, signals here (\d+)", node.stdout)
    return {int(rank): int(count) for rank, count in found}


@pytest.mark.slow
def test_a_notice_reaches_every_rank_of_one_node_then_its_grace_period_ends(
        tmp_path, nothing_left_behind):
    script = tmp_path / "noticed.py"
    script.write_text(NOTICED.replace("{REQUEUE_EXIT_CODE}", str(REQUEUE_EXIT_CODE)))
    with LocalCluster(nodes=2, procs_per_node=2, isolation="loopback", echo=False) as cluster:
        # SIGUSR1, what SLURM's --signal sends: torchrun would die of it, the ranks get it
        polite = cluster.run(script, args=["save"], timeout_s=60, notice=Notice(
            target=1, on_output="ready", grace_s=20.0, signal=signal.SIGUSR1))
        stubborn = cluster.run(script, args=["ignore"], timeout_s=60,
                               notice=Notice(target=1, on_output="ready", grace_s=2.0))
    report = polite.notice
    assert report.where == "node 1" and report.signal_name == "SIGUSR1"
    assert len(report.ranks) == 2 and report.exited_in_grace and report.took_s < 20.0
    assert _signals_seen(polite.nodes[1]) == dict.fromkeys(report.ranks, 1), \
        "both ranks of node 1 got the signal, once"
    assert set(_signals_seen(polite.nodes[0]).values()) == {0}, "node 0 got none"
    assert polite.exit_codes == dict.fromkeys(range(4), REQUEUE_EXIT_CODE)
    assert report.requeue_requested and polite.requeue_requested
    assert polite.failed_rank is None and polite.error.startswith("node 1 was given notice")

    report = stubborn.notice
    assert report.killed and 2.0 <= report.took_s < 15.0 and not stubborn.requeue_requested
    assert report.exit_codes == dict.fromkeys(report.ranks, -signal.SIGKILL)
    assert stubborn.failed_rank is None, "the other node's failure is the notice's doing"
    assert stubborn.error.startswith("node 1 was given notice: SIGTERM")
    assert "killed (SIGKILL)" in stubborn.error


SLEEP = """
import time
print("started", flush=True)
time.sleep(600)
"""


@needs_netns
def test_teardown_always_cleans_up_and_stale_namespaces_are_swept(tmp_path,
                                                                 nothing_left_behind):
    for error in (RuntimeError("a failing test"), KeyboardInterrupt()):
        with pytest.raises(type(error)), LocalCluster(3, 1, "netns", echo=False) as cluster:
            names = cluster.topology.namespaces
            assert len(names) == 4 and set(names) <= set(netns.list_namespaces())
            raise error
        assert not set(names) & set(netns.list_namespaces()), f"left after {error!r}"

    # Ctrl-C while a run is under way: the nodes' processes and the namespaces go.
    script = tmp_path / "sleep.py"
    script.write_text(SLEEP)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt), LocalCluster(2, 1, "netns", echo=False) as cluster:
            names = cluster.topology.namespaces
            signal.setitimer(signal.ITIMER_REAL, 1.0)
            cluster.run(script, timeout_s=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not set(names) & set(netns.list_namespaces())

    # A run killed with SIGKILL cannot clean up: the next cluster sweeps what it left.
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale, live = f"{netns.PREFIX}{gone.pid}-abcdef-n0", f"{OURS}fedcba-n0"
    try:
        for name in (stale, live):
            netns.ip("netns", "add", name)
        swept = netns.sweep_stale()
        assert stale in swept and live not in swept, "only a dead maker's namespaces go"
        assert live in netns.list_namespaces()
    finally:
        for name in (stale, live):
            netns.ip("netns", "delete", name, check=False)


def test_auto_falls_back_to_loopback_and_says_why(monkeypatch, caplog):
    monkeypatch.setattr(netns, "unavailable_reason", lambda: "not root (simulated)")
    with caplog.at_level(logging.WARNING, logger="gpulab.distributed.runtime.cluster"), \
            LocalCluster(2, 2) as cluster:
        assert cluster.isolation == "loopback" and cluster.topology is None
        assert cluster.addresses == ["127.0.0.1", "127.0.0.1"]
        assert "not root (simulated)" in cluster.note and "loopback" in cluster.note
        with pytest.raises(RuntimeError, match="no interface between the nodes"):
            cluster.traffic()
    assert "not root (simulated)" in caplog.text
    with pytest.raises(NetnsError, match="not root.*isolation='loopback'"), \
            LocalCluster(2, 1, isolation="netns"):
        pass
    with LocalCluster(2, 1, isolation="loopback") as quiet:
        assert quiet.note == "", "asking for loopback is not a fallback"
    for outside in (LocalCluster(), quiet):  # never entered, and already left
        with pytest.raises(RuntimeError, match="inside `with LocalCluster"):
            outside.run(TRAIN_SCRIPT)
    with pytest.raises(ValueError, match="isolation must be"):
        LocalCluster(isolation="docker")


FAIL_START_ONCE_THEN_HANG = """
import os, sys, time
import torch.distributed as dist

if os.environ["RANK"] == "1":
    try:
        os.close(os.open(sys.argv[1], os.O_CREAT | os.O_EXCL))  # the first attempt only
        time.sleep(4)  # a start-up slower than timeout_s, as on a busy machine
        os.environ["GLOO_SOCKET_IFNAME"] = "nosuchif0"  # gloo cannot open its device
    except FileExistsError:
        pass
dist.init_process_group("gloo")
print("joined", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_start_failure_is_retried_and_a_hang_is_cut_by_the_timeout(tmp_path, caplog,
                                                                    nothing_left_behind):
    # timeout_s is shorter than the first attempt's start-up, yet that attempt is retried: the
    # limit counts only once every rank has joined the process group, which it never does.
    script = tmp_path / "hang.py"
    script.write_text(FAIL_START_ONCE_THEN_HANG)
    marker = tmp_path / "failed-once"
    with caplog.at_level(logging.INFO, logger="gpulab.distributed.runtime.cluster"), \
            pytest.raises(LaunchTimeout) as caught, \
            LocalCluster(2, 1, isolation="loopback", echo=False) as cluster:
        cluster.run(script, args=[str(marker)], timeout_s=3)
    assert marker.exists(), "the first attempt ran"
    assert "the cluster failed to start" in caplog.text and "retrying" in caplog.text
    assert "init_process_group" in caplog.text, "the log says what failed"
    message = str(caught.value)
    assert "timeout_s=3" in message and "rank 0: running" in message
    assert "hang.py" in caught.value.stacks[1], "rank 1's stack shows where it sleeps"


def _final(result) -> dict:
    lines = [line for line in result.stdout.splitlines() if "final: " in line]
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0].partition("final: ")[2])


@pytest.mark.slow
def test_a_killed_worker_comes_back_and_training_ends_where_it_would_have(
        tmp_path, nothing_left_behind):
    args = ["--steps", "30", "--checkpoint-every", "5"]

    def train(folder: str, **run_options):
        with LocalCluster(nodes=2, procs_per_node=1, echo=False) as cluster:
            return cluster.run(TRAIN_SCRIPT, ["--checkpoint-dir", str(tmp_path / folder), *args],
                               timeout_s=120, **run_options)

    # Two clusters side by side: the uninterrupted run, and one whose rank 1 dies at step 12.
    with ThreadPoolExecutor(2) as pool:
        uninterrupted = pool.submit(train, "a")
        interrupted = pool.submit(train, "b", max_restarts=1, env={"GPULAB_FAULT_STEP": "12"})
        reference, killed = uninterrupted.result(), interrupted.result()
    assert reference.ok, reference.error
    assert killed.ok, killed.error
    assert "resumed" not in reference.stdout
    assert "[rank 1] rank 1 kills itself at step 12" in killed.stdout
    assert killed.stdout.count("resumed from step 10") == 2, "both ranks resumed at step 10"
    want, got = _final(reference), _final(killed)
    assert got["step"] == want["step"] == 30
    assert got["losses"] == want["losses"], "every step's loss, bit for bit (float.hex)"
    assert got["params_sha256"] == want["params_sha256"], "the same final weights, bit for bit"
    assert (tmp_path / "b" / "checkpoint.pt").exists()
    assert not list((tmp_path / "b").glob("*.tmp")), "checkpoints are renamed into place"


SPEC = JobSpec(name="gpt-ddp", nodes=3, procs_per_node=4, script="/shared/train.py",
               args=("--steps", "1000", "--note", "it's a 'test'"),
               image="nvcr.io/nvidia/pytorch:24.05-py3", gpus_per_node=4, cpus_per_node=32,
               memory_gb=64, partition="gpu", max_restarts=2, rdzv_port=29600,
               env={"NCCL_DEBUG": "WARN"})


def _torchrun_flags(words: list[str]) -> dict[str, str]:
    return dict(w.removeprefix("--").split("=", 1) for w in words if w.startswith("--")
                and "=" in w)


def test_sbatch_script_runs_torchrun_on_every_node(tmp_path):
    text = render_sbatch(SPEC)
    directives = dict(line.removeprefix("#SBATCH --").split("=", 1)
                      for line in text.splitlines() if line.startswith("#SBATCH"))
    assert directives == {"job-name": "gpt-ddp", "nodes": "3", "ntasks-per-node": "1",
                          "gpus-per-node": "4", "cpus-per-task": "32", "mem": "64G",
                          "time": "01:00:00", "partition": "gpu", "output": "gpt-ddp-%j.out"}
    # Run the script with stand-ins for scontrol and srun: the shell expands the endpoint.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A long node list: a reader that stops after the first line would break scontrol's pipe.
    fakes = {"scontrol": 'printf "gpu-07\\ngpu-08\\ngpu-09\\n"; seq -f "gpu-%05g" 100000',
             "srun": 'printf "%s\\n" "$@" > "$SRUN_ARGS"'}
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(stat.S_IRWXU)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST="gpu-[07-09]", SRUN_ARGS=str(tmp_path / "srun.args"))
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    words = (tmp_path / "srun.args").read_text().splitlines()
    assert words[0] == "torchrun" and words[-5:] == ["/shared/train.py", *SPEC.args]
    assert _torchrun_flags(words) == {
        "nnodes": "3", "nproc-per-node": "4", "rdzv-backend": "c10d",
        "rdzv-endpoint": "gpu-07:29600", "rdzv-id": "4242", "max-restarts": "2"}
    # The srun line as written, parsed without running it: the same words, unexpanded.
    srun_line = text.replace("\\\n", " ").split("\nsrun ", 1)[1].splitlines()[0]
    assert shlex.split(srun_line)[-5:] == words[-5:]
    assert "export NCCL_DEBUG=WARN" in text
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text, "max_restarts=2 needs it"
    elastic = render_sbatch(JobSpec(name="el", nodes=4, procs_per_node=1, script="t.py",
                                    min_nodes=2))
    assert "#SBATCH --nodes=2-4" in elastic and "--nnodes=2:4" in elastic
    assert "--gpus-per-node" not in elastic and "--partition" not in elastic
    assert "export" not in elastic, "no restarts, no extra environment"


def test_pytorchjob_parses_back_to_the_spec():
    job = yaml.safe_load(render_pytorchjob(SPEC))
    assert job == pytorchjob(SPEC), "the hand-written YAML parses to the dict it came from"
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert job["metadata"] == {"name": "gpt-ddp"}
    spec = job["spec"]
    assert spec["nprocPerNode"] == "4", "a string in the kubeflow.org/v1 API"
    assert "elasticPolicy" not in spec
    replicas = spec["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 2
    for role in ("Master", "Worker"):
        assert replicas[role]["restartPolicy"] == "OnFailure"
        (container,) = replicas[role]["template"]["spec"]["containers"]
        assert container["name"] == "pytorch" and container["image"] == SPEC.image
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 4, "cpu": 32,
                                                    "memory": "64Gi"}
        assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29600}]
        assert container["env"] == [{"name": "NCCL_DEBUG", "value": "WARN"},
                                    {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"}]
        command = container["command"]
        assert command[0] == "torchrun" and command[-5:] == ["/shared/train.py", *SPEC.args]
        assert _torchrun_flags(command) == {
            "nnodes": "3", "nproc-per-node": "4", "rdzv-backend": "c10d",
            "rdzv-endpoint": "gpt-ddp-master-0:29600", "rdzv-id": "gpt-ddp",
            "max-restarts": "2"}
    # The same torchrun command as the sbatch script's, apart from where the endpoint is.
    sbatch = render_sbatch(SPEC).replace("\\\n", " ").split("\nsrun ", 1)[1].splitlines()[0]
    same = {"rdzv-endpoint", "rdzv-id"}
    assert {k: v for k, v in _torchrun_flags(shlex.split(sbatch)).items() if k not in same} \
        == {k: v for k, v in _torchrun_flags(command).items() if k not in same}

    elastic = yaml.safe_load(render_pytorchjob(JobSpec(
        name="one", nodes=3, procs_per_node=2, script="t.py", min_nodes=1, max_restarts=5)))
    assert elastic["spec"]["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 1,
                                                "maxReplicas": 3, "maxRestarts": 5}
    (container,) = elastic["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"]
    assert "--nnodes=1:3" in container["command"] and "resources" not in container
    single = yaml.safe_load(render_pytorchjob(JobSpec(name="s", nodes=1, procs_per_node=1,
                                                      script="t.py")))
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"], "no Worker of size 0"


SPOT = dataclasses.replace(SPEC, grace_period_s=120, requeues=3)  # told 120 s ahead, 3 requeues


def _run_sbatch(tmp_path, text: str, srun_status: int, restarts: int) -> tuple[int, str, list]:
    """Run an sbatch script with stand-ins for srun (exits with `srun_status`) and scontrol;
    return the script's status, what scontrol was asked besides the host names, srun's words."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fakes = {"scontrol": 'if [ "$1" = show ]; then printf "gpu-07\\ngpu-08\\n"; '
                         'else echo "$@" >> "$SCONTROL_CALLS"; fi',
             "srun": f'printf "%s\\n" "$@" > "$SRUN_ARGS"; exit {srun_status}'}
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(stat.S_IRWXU)
    script, calls = tmp_path / "job.sbatch", tmp_path / "scontrol.calls"
    script.write_text(text)
    calls.write_text("")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST="gpu-[07-08]", SLURM_RESTART_COUNT=str(restarts),
               SRUN_ARGS=str(tmp_path / "srun.args"), SCONTROL_CALLS=str(calls))
    done = subprocess.run(["bash", str(script)], env=env, timeout=30)
    return done.returncode, calls.read_text(), (tmp_path / "srun.args").read_text().splitlines()


def test_a_spot_job_is_told_before_it_is_stopped_and_queued_again(tmp_path):
    text = render_sbatch(SPOT)
    directives = [line.removeprefix("#SBATCH ") for line in text.splitlines()
                  if line.startswith("#SBATCH")]
    # USR1 120 s before the time limit to every process of the steps (not "B:", the shell)
    assert "--signal=USR1@120" in directives and "--requeue" in directives
    assert "--open-mode=append" in directives, "a requeued job keeps its earlier output"
    # Stopped early: requeued while under the limit; done, or requeued 3 times: not again.
    for srun_status, restarts, requeued in ((1, 0, True), (1, 2, True), (1, 3, False),
                                            (0, 0, False)):
        status, calls, words = _run_sbatch(tmp_path, text, srun_status, restarts)
        assert status == srun_status, "the job ends with srun's status"
        assert (calls == "requeue 4242\n") == requeued, (srun_status, restarts, calls)
    # torchrun itself accepts the flags: it passes USR1 on and waits the grace period.
    args = torch_run.get_args_parser().parse_args(words[1:])
    assert args.signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    assert args.shutdown_timeout == 120 and args.training_script == "/shared/train.py"
    assert render_sbatch(dataclasses.replace(SPOT, notice_signal="TERM")).count("SIGTERM") == 1

    job = yaml.safe_load(render_pytorchjob(SPOT))
    assert job == pytorchjob(SPOT) and job["spec"]["runPolicy"] == {"backoffLimit": 3}
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert replica["restartPolicy"] == "OnFailure", "75 is retried (ExitCode: not < 128)"
        pod = replica["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == 120
        (container,) = pod["containers"]
        assert "--shutdown-timeout=120" in container["command"]
    plain = render_sbatch(SPEC) + render_pytorchjob(SPEC)
    assert not any(word in plain for word in ("--signal", "--requeue", "runPolicy",
                                              "terminationGracePeriodSeconds", "shutdown"))
    for wrong in ({"grace_period_s": 0}, {"notice_signal": "SIGUSR1"}, {"requeues": -1}):
        with pytest.raises(ValueError):
            dataclasses.replace(SPOT, **wrong)


def test_yaml_writer_round_trips_awkward_strings_and_specs_are_checked():
    awkward = {"plain": "text", "colon": "a: b", "quote": 'say "hi"', "yes": "yes",
               "number": "123", "newline": "two\nlines", "unicode": "nœud", "empty": "",
               "list": ["-x", "#not a comment", {"k": "v", "n": 1, "b": True}],
               "nested": {"deeper": {"x": [1, 2]}}, "none": None, "nothing": []}
    assert yaml.safe_load(to_yaml(awkward)) == awkward
    for bad in ("GPT", "9lives", "under_score", "x" * 51):
        with pytest.raises(ValueError, match="lowercase letters"):
            JobSpec(name=bad, nodes=1, procs_per_node=1, script="t.py")
    with pytest.raises(ValueError, match="min_nodes"):
        JobSpec(name="a", nodes=2, procs_per_node=1, script="t.py", min_nodes=3)
    with pytest.raises(ValueError, match="HH:MM:SS"):
        JobSpec(name="a", nodes=2, procs_per_node=1, script="t.py", time_limit="2h")


def test_cluster_train_batches_depend_on_the_step_alone():
    from gpulab.distributed.cluster_train import batch_indices

    shards = [batch_indices(0, step=7, batch_size=8, rank=r, world_size=2) for r in range(2)]
    assert shards[0].tolist() == batch_indices(0, 7, 8, 0, 2).tolist(), "replayable"
    assert not set(shards[0].tolist()) & set(shards[1].tolist()), "ranks get disjoint samples"
    assert len(shards[0]) == len(shards[1]) == 4
    assert batch_indices(0, 8, 8, 0, 2).tolist() != shards[0].tolist(), "a new batch per step"



QUIET_UNTIL_HEARD = """
import os, sys, time
print("start-up chatter", flush=True)
while not os.path.exists(sys.argv[1]):  # silent until the launcher has said it is alive
    time.sleep(0.05)
print("progress: done", flush=True)
"""


def test_a_filtered_run_shows_its_lines_and_says_it_is_alive_when_silent(
        tmp_path, capsys, monkeypatch, nothing_left_behind):
    """run_capstone's progress mode: only the lines the filter keeps, and a heartbeat when the
    nodes show nothing for HEARTBEAT_S (a restart of the group takes that long). The rank stays
    silent until the heartbeat is said (a file it waits for), however long that takes."""
    script, heard = tmp_path / "quiet.py", tmp_path / "heard"
    script.write_text(QUIET_UNTIL_HEARD)
    monkeypatch.setattr(cluster_module, "HEARTBEAT_S", 1.0)  # quicker; the order is the event's
    say = OutputForwarder.say

    def say_and_tell(self, text, to_stderr=False):
        say(self, text, to_stderr)
        if text.startswith("[cluster] still running"):
            heard.touch()

    monkeypatch.setattr(OutputForwarder, "say", say_and_tell)
    with LocalCluster(nodes=1, procs_per_node=1, isolation="loopback",
                      echo=lambda line: "progress:" in line) as cluster:
        result = cluster.run(script, args=[str(heard)], timeout_s=60)
    assert result.ok, result.error
    out = capsys.readouterr().out
    assert "progress: done" in out and "start-up chatter" not in out
    assert re.search(r"\[cluster\] still running, \d+ s so far", out), out
    assert "start-up chatter" in result.nodes[0].stdout, "filtered from the screen, still kept"
