"""Kernel plumbing of the lab: namespaces, veths, addresses, routes and sysctls through
pyroute2 (netlink), plus running and finding processes inside those namespaces.

Veths are created from inside the router namespace with their peer placed straight into
the host namespace, so no interface name ever appears in the root namespace and two labs
can use the same interface names.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from pyroute2 import NetNS, netns

from azprobe.errors import PrerequisiteError
from azprobe.dev.lab.topology import LabPlan, Link

IFA_F_NODAD = 0x02  # IPv6 addresses usable at once, no 1-2 s of "tentative"
NETNS_DIR = Path("/run/netns")


def require_root() -> None:
    if os.geteuid() != 0:
        raise PrerequisiteError("the lab creates network namespaces and needs root (CAP_NET_ADMIN): "
                                "run it with sudo")


def list_lab_namespaces(name: str) -> list[str]:
    """Every namespace of lab `name`, found by prefix (works after a crash too)."""
    return sorted(ns for ns in netns.listnetns() if ns.startswith(f"{name}-"))


def ns_inode(ns: str) -> tuple[int, int] | None:
    try:
        st = os.stat(NETNS_DIR / ns)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def pids_in_namespaces(namespaces: Iterable[str]) -> dict[int, str]:
    """pid -> namespace, for every process whose network namespace is one of these."""
    wanted = {}
    for ns in namespaces:
        ino = ns_inode(ns)
        if ino is not None:
            wanted[ino] = ns
    found: dict[int, str] = {}
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        ns = wanted.get((st.st_dev, st.st_ino))
        if ns is not None and int(entry) != os.getpid():
            found[int(entry)] = ns
    return found


def _alive(pid: int) -> bool:
    # Reap our own children first, so a dead child is not mistaken for a live zombie.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def pid_alive(pid: int) -> bool:
    return _alive(pid)


def kill_pids(pids: Iterable[int], timeout: float = 3.0) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL whatever is left."""
    pending = [p for p in pids if p != os.getpid()]
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    pending = _wait_gone(pending, timeout)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(pending, timeout)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Poll until every pid has exited or `timeout` passes; returns the ones still alive."""
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        if pids:
            time.sleep(0.02)
    return pids


def ns_argv(ns: str, argv: Sequence[str]) -> list[str]:
    """`ip netns exec` setns()es and then execs argv, so the pid is argv's own."""
    return ["ip", "netns", "exec", ns, *argv]


def python_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_in_ns(ns: str, argv: Sequence[str], *, input: str | None = None, timeout: float = 30.0,
              check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(ns_argv(ns, argv), input=input, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise PrerequisiteError(f"`{' '.join(argv)}` in namespace {ns} failed "
                                f"(exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def set_sysctls(ns: str, values: dict[str, str]) -> None:
    """Write /proc/sys inside `ns`: pushns() moves this thread there, /proc/sys/net follows."""
    netns.pushns(ns)
    try:
        for key, value in values.items():
            Path("/proc/sys", *key.split(".")).write_text(value)
    finally:
        netns.popns()


def _disable_offloads(ns: str, ifname: str) -> None:
    # With TSO/GSO/GRO on, one dropped super-packet is dozens of segments lost at once,
    # which would make nft drop counts and kernel retransmit counts incomparable.
    run_in_ns(ns, ["ethtool", "-K", ifname, "tso", "off", "gso", "off", "gro", "off"])


def _add_addresses(ipr: NetNS, index: int, link: Link, router_side: bool) -> None:
    v4 = link.router_v4 if router_side else link.host_v4
    ipr.addr("add", index=index, address=str(v4.ip), prefixlen=v4.network.prefixlen)
    v6 = link.router_v6 if router_side else link.host_v6
    if v6 is not None:
        ipr.addr("add", index=index, address=str(v6.ip), prefixlen=v6.network.prefixlen, flags=IFA_F_NODAD)


def _lo_up(ipr: NetNS) -> None:
    ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")


def build(plan: LabPlan) -> None:
    """Create the namespaces, veths, addresses, routes and sysctls of `plan`."""
    # sysctls before any veth exists, so "default" applies to every interface created later.
    if plan.ipv6:
        # No DAD anywhere, also for link-local addresses: a tentative link-local address
        # makes neighbour discovery drop the first packets of a fresh lab.
        ipv6 = {"net.ipv6.conf.all.accept_dad": "0", "net.ipv6.conf.default.accept_dad": "0"}
    else:
        ipv6 = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
    for ns in plan.namespaces:
        netns.create(ns)
        forwarding = {"net.ipv4.ip_forward": "1", "net.ipv6.conf.all.forwarding": "1"} if ns == plan.router_ns else {}
        set_sysctls(ns, {**ipv6, **forwarding})
    router = NetNS(plan.router_ns)
    try:
        _lo_up(router)
        for zone in plan.zones:
            for host_ns, link in (*((s.ns, s.link) for s in zone.servers), *((n.ns, n.link) for n in zone.clients)):
                router.link("add", ifname=link.router_ifname, kind="veth",
                            peer={"ifname": link.host_ifname, "net_ns_fd": host_ns})
                r_index = router.link_lookup(ifname=link.router_ifname)[0]
                _add_addresses(router, r_index, link, router_side=True)
                router.link("set", index=r_index, state="up")
                host = NetNS(host_ns)
                try:
                    _lo_up(host)
                    h_index = host.link_lookup(ifname=link.host_ifname)[0]
                    _add_addresses(host, h_index, link, router_side=False)
                    host.link("set", index=h_index, state="up")
                    host.route("add", dst="0.0.0.0/0", gateway=str(link.router_v4.ip))
                    if link.router_v6 is not None:
                        host.route("add", dst="::/0", gateway=str(link.router_v6.ip), family=10)
                finally:
                    host.close()
                _disable_offloads(plan.router_ns, link.router_ifname)
                _disable_offloads(host_ns, link.host_ifname)
    finally:
        router.close()


def remove_namespaces(namespaces: Iterable[str]) -> None:
    """Delete namespaces (their veths and nft tables go with them); missing ones are fine."""
    for ns in namespaces:
        with contextlib.suppress(FileNotFoundError, OSError):
            netns.remove(ns)


def read_netstat(ns: str) -> dict[str, int]:
    """The namespace's /proc/net/netstat and /proc/net/snmp as nstat-style names
    (TcpExtTCPTimeouts, TcpRetransSegs, ...)."""
    out = run_in_ns(ns, ["cat", "/proc/net/netstat", "/proc/net/snmp"]).stdout
    return parse_proc_net_counters(out)


def parse_proc_net_counters(text: str) -> dict[str, int]:
    """Pairs of "Prefix: names" / "Prefix: values" lines -> {PrefixName: value}."""
    counters: dict[str, int] = {}
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for header, values in zip(lines[0::2], lines[1::2]):
        prefix = header[0].rstrip(":")
        for key, value in zip(header[1:], values[1:]):
            with contextlib.suppress(ValueError):
                counters[prefix + key] = int(value)
    return counters
