"""A multi-node cluster on one machine: N nodes x M processes, started as a real cluster starts
them, one torchrun agent per node, the nodes joined by a c10d rendezvous.

    with LocalCluster(nodes=2, procs_per_node=2) as cluster:   # isolation="auto"
        result = cluster.run("train.py", args=["--steps", "20"], timeout_s=120)
    result.ok, result.nodes[1].stdout, result.failed_rank, result.error

isolation
  "netns"     each node in its own network namespace with its own address, the nodes joined by a
              virtual Ethernet switch (netns.py): traffic between nodes crosses a real interface,
              veth0, and GLOO_SOCKET_IFNAME=veth0 makes gloo use it. Needs root and `ip`.
  "loopback"  every node on 127.0.0.1: the same torchrun commands with no network in between.
  "auto"      netns where the machine allows it, else loopback; `cluster.note` says why.

Each node runs
    torchrun --nnodes N --nproc-per-node M --rdzv-backend c10d --rdzv-endpoint NODE0_ADDR:PORT
             --rdzv-id ID --local-addr NODE_ADDR --max-restarts R script.py ARGS
(inside `ip netns exec NODE_NS` when isolated). There is no --node-rank: the c10d rendezvous
numbers the nodes itself, so global ranks need not follow LocalCluster's node order.
--local-addr matters in a namespace: without it, torchrun would advertise the machine's
hostname, whose address does not exist inside the namespace.

On the cpu runner (Linux) each node also has a warm server that forks its agent and its ranks
(nodeserver.py): the launcher runs `python node_client.py SOCKET --agent ARGS` for the agent,
and torchrun `--no-python python node_client.py SOCKET REPORT script.py ARGS` instead of `-m
gpulab.distributed.runtime.torchrun_entry`, so that neither spends the 3 to 5 s of CPU a fresh
interpreter spends importing torch. The servers live as long as the `with` block, and are
replaced when a run's environment differs; GPULAB_FRESH_RANKS=1 turns them off.

run() adds what torchrun_script adds (time limits that stop whole process trees, output by node
and rank, the failing rank's traceback) plus: a node whose agent gives up ends the run (with a
fixed node count the others can only wait), and a start-up failure (a port taken between
choosing and binding it, a rare gloo connection abort inside init_process_group) is retried once,
logged to this module's logger, as run_on_ranks does. run(notice=Notice(target=node, ...))
gives one node a preemption notice mid-run: its ranks get the signal, and after the grace period
whatever is left of the node is killed (notice.py); result.notice says what happened.
Leaving the `with` block always deletes the namespaces, also on an exception or Ctrl-C;
entering it first deletes the namespaces that a killed run left behind.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (multi-node launch)
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from gpulab.distributed.runtime import bootstrap, netns, nodeserver, processes
from gpulab.distributed.runtime.bootstrap import PACKAGE_ROOT
from gpulab.distributed.runtime.cluster_result import (
    START_FAILURE,
    ClusterResult,
    NodeResult,
    diagnose,
    exit_codes,
    node_ranks,
)
from gpulab.distributed.runtime.errors import ProcessGroupStartError, RankError
from gpulab.distributed.runtime.notice import REQUEUE_EXIT_CODE, NoticeClock, running
from gpulab.distributed.runtime.torchrun import RunClock, starting_ranks, timeout_error
from gpulab.distributed.runtime.worker import describe_status, read_status

_log = logging.getLogger(__name__)
_GIVE_UP_GRACE_S = 1.0  # after a node's agent fails: time for the others to report their own
# After a noticed node's ranks are gone: time for its agent to pass on their last lines (torchrun
# tails its workers' output) and exit; then it is stopped (it might restart them).
_NOTICED_AGENT_LINGER_S = 2.0
# With echo a filter (progress lines only), a run that shows nothing for this long says it is
# still running: a restart of the group (new processes, imports, rendezvous) takes 10-20 s.
HEARTBEAT_S = 10.0


class LocalCluster:
    """N nodes x M processes on this machine; use it as a context manager (see the module)."""

    def __init__(self, nodes: int = 2, procs_per_node: int = 2, isolation: str = "auto", *,
                 subnet: str = "10.213.0", start_timeout_s: float = 120.0,
                 start_retries: int = 1, echo=True):
        """echo: print the nodes' output (True), none of it (False), or the lines a filter,
        echo(line) -> bool, keeps; with a filter, a silent run says every HEARTBEAT_S seconds
        that it is still running."""
        if isolation not in ("auto", "netns", "loopback"):
            raise ValueError(f"isolation must be 'auto', 'netns' or 'loopback', got {isolation!r}")
        if nodes < 1 or procs_per_node < 1:
            raise ValueError(f"need nodes >= 1 and procs_per_node >= 1, got {nodes}, "
                             f"{procs_per_node}")
        self.nodes, self.procs_per_node, self.requested = nodes, procs_per_node, isolation
        self.subnet, self.start_timeout_s = subnet, start_timeout_s
        self.start_retries, self.echo = start_retries, echo
        self.isolation: str | None = None  # decided on entering: "netns" or "loopback"
        self.note = ""  # why "auto" chose loopback, when it did
        self.topology: netns.NetnsTopology | None = None
        self.addresses: list[str] = []  # node i's address, once entered
        self._open = False  # between __enter__ and __exit__
        self._servers: list[nodeserver.NodeServer] = []  # each node's rank server
        self._server_dir: str | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def __enter__(self) -> LocalCluster:
        self._start()
        self._open = True
        return self

    def _start(self) -> None:
        reason = netns.unavailable_reason()
        if self.requested == "netns" and reason:
            raise netns.NetnsError(f"isolation='netns' is not possible here: {reason}. "
                                   "Use isolation='loopback' (or 'auto').")
        if self.requested == "loopback" or reason:
            return self._use_loopback(reason)
        swept = netns.sweep_stale()
        if swept:
            _log.info("deleted network namespaces left by runs that died: %s", ", ".join(swept))
        try:
            self.topology = netns.NetnsTopology.create(self.nodes, self.subnet)
        except netns.NetnsError as error:  # e.g. root in a container without CAP_SYS_ADMIN
            if self.requested == "netns":
                raise
            return self._use_loopback(str(error))
        self.isolation = "netns"
        self.addresses = [node.address for node in self.topology.nodes]

    def _use_loopback(self, reason: str | None) -> None:
        self.isolation, self.addresses = "loopback", ["127.0.0.1"] * self.nodes
        if self.requested == "auto":
            self.note = (f"isolation='auto' chose loopback: {reason}. Every node runs on "
                         "127.0.0.1; pass isolation='loopback' to ask for that.")
            _log.warning(self.note)

    def __exit__(self, *exc) -> None:
        self._open = False
        self._close_servers()
        if self.topology is not None:
            left = self.topology.destroy()
            self.topology = None
            if left:
                _log.warning("could not delete network namespaces %s", left)

    def traffic(self) -> list[netns.InterfaceBytes]:
        """Each node's veth0 byte counters (netns only): what crossed the interface so far."""
        if self.topology is None:
            raise RuntimeError("traffic() needs isolation='netns' inside the `with` block: on "
                               "loopback there is no interface between the nodes to count.")
        return self.topology.traffic()

    def run(self, script, args: Sequence[str] = (), env: dict[str, str] | None = None, *,
            timeout_s: float | None = 120.0, max_restarts: int = 0,
            check: bool = False, notice=None) -> ClusterResult:
        """Run `script` (a path) on every node; return what happened. timeout_s counts from the
        moment every rank is past start-up (Python, imports and init_process_group have
        start_timeout_s); past it every process is stopped and LaunchTimeout says where each
        rank was. max_restarts is torchrun's: a failed worker group is restarted that many
        times. check=True raises RankError when the run fails. notice: a Notice for one node
        (its target is the node's index here): see notice.py; once the node is gone the other
        nodes get the same grace period to finish before they are stopped."""
        if not self._open:
            raise RuntimeError("use the cluster inside `with LocalCluster(...) as cluster:`")
        if notice is not None and not 0 <= notice.target < self.nodes:
            raise ValueError(f"notice.target must be a node, 0..{self.nodes - 1}, got "
                             f"{notice.target}")
        script = Path(script).resolve()
        if not script.is_file():
            raise FileNotFoundError(f"no script at {script}")
        for attempt in range(1, self.start_retries + 2):
            last = attempt > self.start_retries
            try:
                result = self._attempt(script, args, env, timeout_s, max_restarts, attempt,
                                       notice)
            except ProcessGroupStartError as error:
                if last:
                    raise
                _log.info("%s -- retrying the launch once.", error)
                continue
            # With max_restarts, torchrun's own restarts already cover start-up failures.
            # (After a notice the error starts with the notice: never retried.)
            if result.ok or last or max_restarts or not result.error.startswith(START_FAILURE):
                break
            # Logged, not printed: a launch that then succeeds shows what it always shows.
            _log.info("%s -- retrying the launch once.", result.error)
        if check and not result.ok:
            who = f"rank {result.failed_rank}" if result.failed_rank is not None else "the run"
            raise RankError(f"{who} failed on the cluster (exit status "
                            f"{result.returncode}):\n{result.error}", result.failed_rank or 0,
                            traceback=result.error)
        return result

    def _attempt(self, script, args, env, timeout_s, max_restarts, attempt,
                 notice=None) -> ClusterResult:
        report = Path(tempfile.mkdtemp(prefix="gpulab-cluster-"))
        clock = NoticeClock(notice) if notice is not None else None
        forwarder = processes.OutputForwarder(keep_lines=None, echo=self.echo,
                                              on_line=clock.saw if clock else None)
        agents: list[subprocess.Popen] = []
        env = self._env(env)
        try:
            servers = self._node_servers(env)
            for node_rank, command in enumerate(self._commands(script, args, report,
                                                               max_restarts, servers)):
                agents.append(subprocess.Popen(  # GPULAB_NODE: each rank says its node
                    command, env=dict(env, GPULAB_NODE=str(node_rank)), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
                prefix = f"[node {node_rank}] "
                forwarder.watch(agents[-1].stdout, prefix, False, key=f"{node_rank}:out")
                forwarder.watch(agents[-1].stderr, prefix, True, key=f"{node_rank}:err")
            codes, failed_first, started = self._supervise(agents, report, forwarder,
                                                           timeout_s, clock)
            forwarder.finish()
            return self._result(codes, failed_first, started, report, forwarder, attempt,
                                clock)
        finally:
            processes.stop(agents)  # whole trees: agents, and workers in their own sessions
            forwarder.finish()
            shutil.rmtree(report, ignore_errors=True)

    def _node_servers(self, env: dict[str, str]) -> list[nodeserver.NodeServer]:
        """Each node's rank server, started with the run's environment (and kept for the next
        run with the same one); none where ranks start fresh (see nodeserver.py)."""
        if not nodeserver.available(env.get("GPULAB_RUNNER", "")):
            return []
        if self._servers and all(server.usable(env) for server in self._servers):
            return self._servers
        self._close_servers()
        self._server_dir = tempfile.mkdtemp(prefix="gpulab-nodes-")
        for node_rank in range(self.nodes):
            prefix = self.topology.exec_prefix(node_rank) if self.topology else []
            path = Path(self._server_dir) / f"node{node_rank}.sock"
            self._servers.append(nodeserver.NodeServer(path, prefix, env))
        return self._servers

    def _close_servers(self) -> None:
        for server in self._servers:
            server.close()
        self._servers = []
        if self._server_dir is not None:
            shutil.rmtree(self._server_dir, ignore_errors=True)
            self._server_dir = None

    def _commands(self, script, script_args, report: Path, max_restarts: int,
                  servers: list[nodeserver.NodeServer]) -> list[list[str]]:
        endpoint_addr = self.addresses[0]
        if self.topology is not None:  # ask node 0's own kernel: the port must be free there
            port = self.topology.free_port(0)
        else:
            port = processes.free_port()
        job = f"gpulab-{uuid.uuid4().hex[:8]}"
        boot = bootstrap.command("agent", os.getpid())
        commands = []
        for node_rank, address in enumerate(self.addresses):
            prefix = self.topology.exec_prefix(node_rank) if self.topology else []
            args = [
                "--nnodes", str(self.nodes), "--nproc-per-node", str(self.procs_per_node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint_addr}:{port}",
                "--rdzv-id", job,
                # Node 0 hosts the rendezvous; on loopback every node would think it may.
                "--rdzv-conf", f"is_host={'true' if node_rank == 0 else 'false'}",
                "--local-addr", address, "--max-restarts", str(max_restarts), "--tee", "3",
                *(servers[node_rank].client_command() if servers
                  else bootstrap.TORCHRUN_RANK),
                str(report), str(script), *map(str, script_args)]
            commands.append(servers[node_rank].agent_command(prefix, args) if servers
                            else prefix + boot + args)
        return commands

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        import gpulab

        interface = (self.topology.interface if self.topology is not None
                     else processes.loopback_interface() or "lo")
        env = dict(os.environ, GPULAB_RUNNER=gpulab.runner.name, PYTHONUNBUFFERED="1",
                   MPLBACKEND="Agg", TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank ${rank}] ",
                   PYTHONPATH=os.pathsep.join([PACKAGE_ROOT, *filter(None, [os.environ.get(
                       "PYTHONPATH")])]),
                   # The interface each node's collectives use: veth0 makes gloo's traffic
                   # between nodes cross it (nccl's bootstrap too; its data path is its own).
                   GLOO_SOCKET_IFNAME=interface, NCCL_SOCKET_IFNAME=interface,
                   # A fresh rendezvous store for every attempt: the store torchrun shares by
                   # default outlives a restart with the last attempt's keys, and a restarted
                   # rank can read a dead peer's address from it (pytorch/pytorch#135712).
                   TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.world_size)))
        env.update(extra or {})
        return env

    def _supervise(self, agents, report: Path, forwarder, timeout_s, notice_clock=None):
        """Wait for the agents; return (exit codes, index of the first to fail, all started)."""
        # timeout_s counts only once every rank is past start-up (imports, init_process_group):
        # counted from the processes' start, a slow start-up could run it out before a rank
        # that failed in init_process_group had told its agent, and the start failure would
        # be reported as a hang instead of being retried.
        clock = RunClock(self.start_timeout_s, timeout_s)
        began = time.monotonic()
        gave_up_at = failed_first = None
        started = False  # every rank's process is up (a failure after this is not its launch)
        while True:
            forwarder.drain()
            if notice_clock is not None:
                self._deliver(notice_clock, report, agents)
            codes = [a.poll() for a in agents]
            if failed_first is None:
                failed_first = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
            if all(c is not None for c in codes):
                return codes, failed_first, started
            now = time.monotonic()
            if callable(self.echo) and now - forwarder.last_printed > HEARTBEAT_S:
                forwarder.say(f"[cluster] still running, {now - began:.0f} s so far")
            started = started or len(list(report.glob("rank*.pid"))) == self.world_size
            starting = starting_ranks(report, self.world_size)
            limit = clock.passed(starting)
            if failed_first is not None:
                # With a fixed node count the other nodes can only wait for the one that gave
                # up (torchrun waits minutes at its exit barrier): stop them shortly after.
                gave_up_at = gave_up_at or now
                # After a notice, the other nodes get its grace period (to save, say).
                noticed = notice_clock is not None and notice_clock.sent
                grace = notice_clock.notice.grace_s if noticed else 0.0
                if now - gave_up_at > max(_GIVE_UP_GRACE_S, grace):
                    processes.stop([a for a in agents if a.poll() is None])
                    return [a.poll() for a in agents], failed_first, started
            elif limit and starting:  # (limits apply to a live run only)
                where = "; ".join(f"rank {r}: {_where(report, r)}" for r in starting)
                raise ProcessGroupStartError(
                    f"the cluster did not start every rank within {limit} s ({where})", None,
                    any(report.glob("rank*.pid")))
            elif limit:
                raise timeout_error(report, self.world_size, limit)
            time.sleep(0.02)

    def _deliver(self, clock: NoticeClock, report: Path, agents) -> None:
        """Send the notice to the target node's ranks when it is due; once they are gone, or
        SIGKILLed at the end of the grace period, the node's agent goes too (the machine is),
        after a moment to pass on their output."""
        target = clock.notice.target
        clock.tend(lambda: node_ranks(report, target),
                   lambda: not any(map(running, clock.pids.values())))
        if clock.ended_at is None:
            return
        agent = agents[target]
        if agent.poll() is None and time.monotonic() - clock.ended_at > _NOTICED_AGENT_LINGER_S:
            processes.stop([agent], grace_s=0.0)

    def _result(self, codes, failed_first, started, report, forwarder, attempt,
                clock=None) -> ClusterResult:
        nodes = tuple(NodeResult(i, address, codes[i], _strip(forwarder, f"{i}:out", i),
                                 _strip(forwarder, f"{i}:err", i))
                      for i, address in enumerate(self.addresses))
        returncode = 0 if failed_first is None else codes[failed_first]
        failed_rank, error = None, ""
        if returncode:
            failed_rank, error = diagnose(report, "\n".join(n.stderr for n in nodes), started)
        ranks_exited = exit_codes(report)
        notice = None
        if clock is not None and clock.sent:
            killed = -processes.KILL_SIGNAL if clock.killed else None
            notice = clock.report(f"node {clock.notice.target}",
                                  {r: ranks_exited.get(r, killed) for r in clock.pids})
            if returncode:  # the notice ended the run: say so first, blame no other rank
                failed_rank, error = None, _after_notice(notice, ranks_exited, error,
                                                         self.world_size)
        return ClusterResult(returncode, nodes, failed_rank, error, attempt, self.isolation,
                             ranks_exited, notice)


def _after_notice(notice, ranks_exited: dict[int, int], error: str, world_size: int) -> str:
    """The error of a run a notice ended: the notice first, then what each other rank did, and
    the first error after it only where a rank failed with one."""
    others = [r for r in range(world_size) if r not in notice.ranks]
    said = [f"rank {r} exited with code {ranks_exited[r]}" if r in ranks_exited
            else f"rank {r} was stopped" for r in others]
    text = f"{notice}\nAfter the notice: {'; '.join(said) or 'no other rank'}."
    if any(ranks_exited.get(r) not in (0, REQUEUE_EXIT_CODE) for r in others):
        text += f"\nThe first error reported:\n{error}"
    return text


def _where(report: Path, rank: int) -> str:
    """What a starting rank is doing, in words (see worker.describe)."""
    path = report / f"rank{rank}.status"
    if not path.exists():
        return "not started: its node is still in rendezvous?"
    return describe_status(*read_status(path))


def _strip(forwarder, key: str, node_rank: int) -> str:
    prefix = f"[node {node_rank}] "
    return "\n".join(line.removeprefix(prefix) for line in forwarder.text(key).splitlines())
