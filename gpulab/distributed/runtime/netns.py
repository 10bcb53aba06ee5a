"""Network namespaces for LocalCluster: one per node, joined by a virtual Ethernet switch, so the
nodes of a local cluster talk over a real network interface instead of loopback.

    topology = NetnsTopology.create(nodes=2)     # needs Linux, root and iproute2's `ip`
    topology.nodes[0]          # NetnsNode(namespace='gpulab-4242-a1b2c3-n0', address='10.213.0.1')
    topology.exec_prefix(0)    # ['ip', 'netns', 'exec', 'gpulab-4242-a1b2c3-n0']: run in node 0
    topology.traffic()         # [InterfaceBytes(rx_bytes, tx_bytes)] per node, from the kernel
    topology.destroy()         # deletes every namespace; their links die with them

The layout; nothing at all is created in the host's own namespace:

    gpulab-<pid>-<token>-sw    the "switch": bridge br0 and one end of each node's veth pair
    gpulab-<pid>-<token>-n<i>  node i: lo (same-node traffic) and veth0 = 10.213.0.<i+1>/24

Why the bridge has a namespace of its own rather than living in the host's: the host's firewall
would see the bridged frames (br_netfilter; Docker sets the FORWARD policy to DROP), and the
host's `ip link` would collect links that outlive a killed run. Here everything lives and dies
with the namespaces. The subnet exists only inside them: it cannot collide with the host's
networks, nor with another cluster's (each has its own switch).

A namespace name carries the pid of the process that made it: sweep_stale() deletes those whose
maker has died (a run killed with SIGKILL cannot clean up), never those of a live process.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (multi-node launch)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PREFIX = "gpulab-"
INTERFACE = "veth0"  # each node's link to the switch, as GLOO_SOCKET_IFNAME names it
_NAME = re.compile(rf"^{PREFIX}(\d+)-([0-9a-f]+)-(sw|n\d+)$")
_RUN_NETNS = Path("/run/netns")  # where `ip netns add` pins a namespace (its mtime: creation)
_PORT_PROBE = ("import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); "
               "print(s.getsockname()[1])")


class NetnsError(RuntimeError):
    """A network namespace could not be made or used; the message quotes `ip`'s answer."""


@dataclass(frozen=True)
class NetnsNode:
    namespace: str  # the node's network namespace
    address: str  # its veth0 address, e.g. "10.213.0.1"


@dataclass(frozen=True)
class InterfaceBytes:
    """A node's veth0 counters, seen from the node: rx came from other nodes, tx went to them."""

    rx_bytes: int
    tx_bytes: int


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here ("not root", ...), or None when they may."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (this process is not root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is not installed"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `ip ARGS`; raise NetnsError with its stderr when it fails and check is true."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def list_namespaces() -> list[str]:
    """The names `ip netns list` shows, e.g. ['gpulab-4242-a1b2c3-n0', ...]."""
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@dataclass(frozen=True)
class NetnsTopology:
    """The namespaces of one local cluster: a switch and `len(nodes)` nodes."""

    switch: str
    nodes: tuple[NetnsNode, ...]
    interface: str = INTERFACE

    @classmethod
    def create(cls, nodes: int, subnet: str = "10.213.0") -> NetnsTopology:
        """Make the switch and `nodes` node namespaces (addresses subnet.1, subnet.2, ...).
        On any failure, whatever was made is deleted before NetnsError is raised."""
        if not 1 <= nodes <= 250:
            raise ValueError(f"nodes must be between 1 and 250, got {nodes}")
        base = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        topology = cls(f"{base}-sw", tuple(NetnsNode(f"{base}-n{i}", f"{subnet}.{i + 1}")
                                           for i in range(nodes)))
        try:
            topology._build()
        except BaseException:  # KeyboardInterrupt included: leave nothing behind
            topology.destroy()
            raise
        return topology

    def _build(self) -> None:
        sw = self.switch
        ip("netns", "add", sw)
        ip("-n", sw, "link", "add", "br0", "type", "bridge")
        ip("-n", sw, "link", "set", "br0", "up")  # no STP: ports forward at once
        for i, node in enumerate(self.nodes):
            ns, port = node.namespace, f"node{i}"
            ip("netns", "add", ns)
            # Both ends are created where they belong: no name ever appears in the host.
            ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", self.interface,
               "netns", ns)
            ip("-n", sw, "link", "set", port, "master", "br0", "up")
            ip("-n", ns, "link", "set", "lo", "up")  # ranks on one node talk over lo
            ip("-n", ns, "addr", "add", f"{node.address}/24", "dev", self.interface)
            ip("-n", ns, "link", "set", self.interface, "up")

    @property
    def namespaces(self) -> list[str]:
        return [node.namespace for node in self.nodes] + [self.switch]

    def exec_prefix(self, node_rank: int) -> list[str]:
        """The command prefix that runs a program inside node `node_rank`'s namespace.
        `ip netns exec` execs the program (no extra process): its pid and parent stay ours."""
        return ["ip", "netns", "exec", self.nodes[node_rank].namespace]

    def free_port(self, node_rank: int) -> int:
        """A TCP port free on that node's address, as the node's own kernel sees it."""
        node = self.nodes[node_rank]
        done = subprocess.run([*self.exec_prefix(node_rank), sys.executable, "-c", _PORT_PROBE,
                               node.address], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise NetnsError(f"could not find a free port in {node.namespace}: {done.stderr}")
        return int(done.stdout)

    def traffic(self) -> list[InterfaceBytes]:
        """Each node's veth0 byte counters (since the link was made), read from the kernel."""
        counters = []
        for node in self.nodes:
            info = json.loads(ip("-n", node.namespace, "-j", "-s", "link", "show", "dev",
                                 self.interface).stdout)[0]["stats64"]
            counters.append(InterfaceBytes(info["rx"]["bytes"], info["tx"]["bytes"]))
        return counters

    def destroy(self) -> list[str]:
        """Delete every namespace of this topology; return those still there (should be [])."""
        for name in self.namespaces:
            ip("netns", "delete", name, check=False)  # a missing one is fine
        left = set(list_namespaces())
        return [name for name in self.namespaces if name in left]


def sweep_stale() -> list[str]:
    """Delete gpulab namespaces whose maker is gone (dead, or its pid reused by a process that
    started after the namespace was made); return their names. Live runs are left alone."""
    import psutil

    removed = []
    for name in list_namespaces():
        found = _NAME.match(name)
        if not found:
            continue
        pid = int(found.group(1))
        try:
            made_at = (_RUN_NETNS / name).stat().st_mtime
        except OSError:
            made_at = None
        try:
            alive = psutil.Process(pid).create_time() <= (made_at or float("inf")) + 1.0
        except psutil.Error:  # no such process (or a zombie we cannot read): its maker is gone
            alive = False
        if not alive:
            ip("netns", "delete", name, check=False)
            removed.append(name)
    return removed
