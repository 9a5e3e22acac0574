"""`azprobe doctor`: the preflight gate. Every check says what it found and, when it is
not fine, the one thing to do about it.

The agent role checks what loading the probe needs (BTF, tracefs, the five
tracepoints, kernel headers, BCC and a real test compile, capabilities). The controller
role checks Consul the way the controller uses it (reachable, a leader, the token
allowed to write and delete under the prefix and to hold a lock session, a sane clock)
and that the configured agents answer. Exit 0 when every required check passes, 1 when
one fails, 2 for bad usage or a bad config file.
"""

from __future__ import annotations

import email.utils
import importlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import click

from azprobe.errors import AzprobeError

OK, WARN, FAIL = "ok", "warn", "fail"
SYMBOLS = {OK: "✓", WARN: "!", FAIL: "✗"}

# Clock skew against Consul: expires_at and lock timing assume clocks within a second
# or so; beyond a few seconds readers would judge fresh weights stale (or the reverse).
SKEW_WARN_S = 1.0
SKEW_FAIL_S = 5.0

# Bits of CapEff in /proc/<pid>/status (linux/capability.h).
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

ACL_FIX = ('give the token a policy with key_prefix "{prefix}" {{ policy = "write" }} and '
           'session_prefix "" {{ policy = "write" }}, then set CONSUL_HTTP_TOKEN_FILE or consul.token_file')


class Role(str, Enum):
    AGENT = "agent"
    CONTROLLER = "controller"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def ok(name: str, detail: str) -> Check:
    return Check(name, OK, detail)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name, WARN, detail, fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, FAIL, detail, fix)


# --- agent role: the kernel and BCC ---------------------------------------------------

def check_btf(btf: Path) -> Check:
    """BTF present, and whether it gives what the BTF-typed (tp_btf) hooks need: the
    socket offsets and the tracepoints' types (else the probe hooks classic tracepoints)."""
    from azprobe.agent import btf as btf_reader  # pure parsing, no BCC

    if not btf.exists():
        return fail("kernel.btf", f"{btf} missing", "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y")
    try:
        btf_reader.tp_btf_requirements(btf_reader.BTF.from_file(btf))
    except btf_reader.BTFError as exc:
        return warn("kernel.btf", f"{btf} present, but not usable for tp_btf hooks ({exc}): the probe hooks "
                    "classic tracepoints", "none needed; tp_btf hooks only make each event cheaper "
                    "(docs/probe.md \"BTF-typed tracepoints\")")
    return ok("kernel.btf", f"{btf} present; socket offsets and tracepoint types read: the probe hooks "
              "BTF-typed tracepoints (tp_btf)")


def check_tracefs(tracefs: Path) -> Check:
    if (tracefs / "events").is_dir():
        return ok("tracefs", f"mounted at {tracefs}")
    return fail("tracefs", f"no {tracefs}/events", f"mount -t tracefs nodev {tracefs}")


def check_tracepoint(tracefs: Path, tracepoint: str) -> Check:
    name = "tracepoint " + tracepoint.replace("/", ":")
    fmt = tracefs / "events" / tracepoint / "format"
    if fmt.exists():
        return ok(name, "present")
    if not (tracefs / "events").is_dir():
        return fail(name, "unknown: tracefs is not mounted", f"mount -t tracefs nodev {tracefs}")
    return fail(name, f"{fmt} missing", "use a kernel that has it (Linux >= 6.0 has all five azprobe uses)")


def check_kernel_headers(release: str) -> Check:
    build = Path("/lib/modules") / release / "build"
    if build.exists():
        return ok("kernel.headers", f"{build} -> {build.resolve()}")
    return fail("kernel.headers", f"{build} missing or dangling",
                "run `make setup` (links it to /usr/src/linux-headers-*-amd64) or install linux-headers-$(uname -r)")


def capability_set(status_text: str, field: str = "CapEff") -> int:
    """The capability bit mask of one Cap* line of /proc/<pid>/status."""
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        if key == field:
            return int(value.strip(), 16)
    raise ValueError(f"no {field} line")


def check_capabilities(cap_eff: int) -> Check:
    have = {name for bit, name in ((CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON"),
                                   (CAP_SYS_ADMIN, "CAP_SYS_ADMIN")) if cap_eff >> bit & 1}
    listed = ", ".join(sorted(have)) or "none of CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN"
    # Measured on 6.18 + BCC 0.26: CAP_BPF + CAP_PERFMON suffice; kernels before 5.8 have
    # neither and need CAP_SYS_ADMIN instead.
    if {"CAP_BPF", "CAP_PERFMON"} <= have or "CAP_SYS_ADMIN" in have:
        return ok("capabilities", f"effective: {listed}")
    return fail("capabilities", f"effective: {listed}",
                "run as root with CAP_BPF and CAP_PERFMON (the azprobe-agent.service bounding set)")


def check_bcc_import() -> Check:
    try:
        bcc = importlib.import_module("bcc")
    except ImportError as exc:
        return fail("bcc.import", f"cannot import bcc: {exc}",
                    "apt-get install python3-bpfcc and run `make setup` (links bcc into the venv)")
    return ok("bcc.import", f"bcc from {Path(bcc.__file__).parent}")


def check_bcc_compile() -> Check:
    """Compile, load and attach the one-line tracepoint program: proves clang, headers,
    the verifier and the attach path together, in the ~1 s the agent's start takes."""
    from azprobe.agent.probe import compile_program  # the agent's loader, so this tests the same path

    from azprobe import bpf

    started = time.monotonic()
    try:
        program = compile_program(bpf.EMPTY_PROGRAM)
    except AzprobeError as exc:
        return fail("bcc.compile", str(exc), "run `azprobe doctor` as root; check kernel.headers and capabilities")
    elapsed = time.monotonic() - started
    program.cleanup()  # type: ignore[attr-defined]
    return ok("bcc.compile", f"{bpf.EMPTY_PROGRAM} compiled, loaded and attached in {elapsed:.1f}s")


def agent_checks(*, tracefs: Path | None = None, btf: Path | None = None) -> Iterator[Check]:
    from azprobe.agent import probe  # the probe's own list of what it attaches to

    tracefs = tracefs or probe.TRACEFS
    yield check_btf(btf or probe.BTF_VMLINUX)
    yield check_tracefs(tracefs)
    for tracepoint in probe.TRACEPOINTS:
        yield check_tracepoint(tracefs, tracepoint)
    yield check_kernel_headers(os.uname().release)
    yield check_capabilities(capability_set(Path("/proc/self/status").read_text()))
    imported = check_bcc_import()
    yield imported
    if not imported.failed:
        yield check_bcc_compile()


def check_collector(bpf_checks: list[Check], configured: str = "auto") -> Check:
    """Which collector `azprobe agent` will run here and why: the BPF probe when every
    check it needs passed, else (collector = auto) the sock_diag sampler, if it works."""
    broken = next((c for c in bpf_checks if c.failed), None)
    if configured == "bpf" or (configured == "auto" and broken is None):
        if broken is None:
            return ok("collector", f"bpf ({configured}): the probe loads here")
        return fail("collector", f"bpf (configured) cannot load: {broken.name}: {broken.detail}", broken.fix)
    from azprobe.agent.sockdiag import dump_tcp_sockets  # noqa: PLC0415

    try:
        count = len(dump_tcp_sockets())
    except Exception as exc:  # netlink errors come in many types
        return fail("collector", f"sockdiag cannot read sockets: {exc}",
                    "the agent needs NETLINK_SOCK_DIAG (Linux with CONFIG_INET_DIAG)")
    why = "configured" if configured == "sockdiag" else f"fallback, because {broken.name}: {broken.detail}"
    return warn("collector", f"sockdiag ({why}); sock_diag reads {count} TCP sockets",
                "socket sampling sees no per-segment RTT, no exact RTO counts and no connect failing between "
                "samples (docs/probe.md); fix the BPF checks above for the probe")


# --- controller role: Consul and the agents ----------------------------------------------

def skew_bounds(sent_at: float, received_at: float, date_header: str) -> tuple[float, float]:
    """(low, high) bounds of local clock minus Consul's clock, in seconds.

    The server stamped Date somewhere between our send and receive, and Date has
    whole-second resolution, so the server's time then lay in [D, D + 1).
    """
    server = email.utils.parsedate_to_datetime(date_header).timestamp()
    return sent_at - (server + 1.0), received_at - server


def judge_skew(low: float, high: float) -> Check:
    # The smallest skew consistent with the measurement: never alarm on rounding.
    least = 0.0 if low <= 0.0 <= high else min(abs(low), abs(high))
    detail = f"local clock minus Consul's: between {low:+.2f}s and {high:+.2f}s"
    fix = "synchronise the clocks (chrony or systemd-timesyncd) on this host and the Consul servers"
    if least > SKEW_FAIL_S:
        return fail("consul.clock_skew", detail, fix)
    if least > SKEW_WARN_S:
        return warn("consul.clock_skew", detail, fix)
    return ok("consul.clock_skew", detail)


def consul_checks(settings: Any) -> Iterator[Check]:
    """Reachable + leader + clock skew from one request, then the ACL write path and a
    lock session. Stops at the first failure: later checks would only repeat it."""
    import requests

    leader_url = settings.address + "/v1/status/leader"
    headers = {"X-Consul-Token": settings.token} if settings.token else {}
    sent_at = time.time()
    try:
        response = requests.get(leader_url, headers=headers, timeout=5.0, verify=settings.ca_file or True)
    except requests.exceptions.RequestException as exc:
        yield fail("consul.reachable", f"no answer from {leader_url}: {type(exc).__name__}",
                   "check consul.address (or CONSUL_HTTP_ADDR, CONSUL_CACERT for https) and that "
                   "Consul is up and reachable from this host")
        return
    received_at = time.time()
    yield ok("consul.reachable", f"{settings.address} answered HTTP {response.status_code}")

    leader = response.text.strip().strip('"') if response.ok else ""
    if not leader:
        yield fail("consul.leader", f"no leader (HTTP {response.status_code}, body {response.text[:80]!r})",
                   "the Consul servers have no quorum: check `consul operator raft list-peers`")
        return
    yield ok("consul.leader", f"leader {leader}")

    date = response.headers.get("Date")
    if date:
        yield judge_skew(*skew_bounds(sent_at, received_at, date))
    else:
        yield warn("consul.clock_skew", "Consul sent no Date header", "compare the clocks by hand (`date -u`)")

    yield from acl_checks(settings)


def acl_checks(settings: Any) -> Iterator[Check]:
    from azprobe.clients import consul as kv
    from azprobe.contracts.kv import doctor_name

    client = kv.make_client(settings)
    key = settings.key(doctor_name(socket.gethostname()))
    nonce = uuid.uuid4().hex
    fix = ACL_FIX.format(prefix=settings.prefix)
    try:
        kv.txn(client, [kv.op_set(key, nonce)])
        read_back = kv.read_key(client, key).value
        kv.txn(client, [kv.op_delete(key)])
    except kv.ConsulPermissionDenied as exc:
        yield fail("consul.acl_kv", f"permission denied writing {key}: {exc}", fix)
        return
    except kv.ConsulError as exc:
        yield fail("consul.acl_kv", f"write/read/delete of {key} failed: {exc}", fix)
        return
    if read_back != nonce.encode():
        yield fail("consul.acl_kv", f"wrote {key} but read back {read_back!r}",
                   "the token may read a filtered view: give it read on the whole prefix")
        return
    yield ok("consul.acl_kv", f"token can write, read and delete under {settings.prefix}")

    try:
        session = client.session.create(name="azprobe-doctor", ttl=10, lock_delay=0)
        client.session.destroy(session)
    except Exception as exc:  # py-consul and requests raise many types; translate them
        error = kv.translate_error(exc, settings.address, "creating a lock session")
        yield fail("consul.acl_session", str(error), fix)
        return
    yield ok("consul.acl_session", "token can create the leader-lock session")


def check_agent(url: str, timeout_s: float) -> Check:
    import requests

    name = f"agent {url}"
    try:
        response = requests.get(url + "/healthz", timeout=timeout_s)
    except requests.exceptions.RequestException as exc:
        return warn(name, f"no answer from {url}/healthz: {type(exc).__name__}",
                    "start azprobe-agent there, and open its listen port to this host")
    if response.status_code != 200:
        return warn(name, f"/healthz answered HTTP {response.status_code}: {response.text[:80]!r}",
                    f"see `journalctl -u azprobe-agent` on {url}")
    return ok(name, "/healthz answered 200")


def agents_checks(urls: list[str], timeout_s: float) -> Iterator[Check]:
    """One line per agent (an agent down is a warning: the controller holds its zone's
    last-known-good), and a failure only when none answers."""
    results = [check_agent(url, timeout_s) for url in urls]
    yield from results
    if urls and all(r.status != OK for r in results):
        yield fail("agents", f"none of the {len(urls)} agents answered",
                   "start the agents, or fix agents.static in the controller config")


def controller_checks(config_path: str | None) -> Iterator[Check]:
    from azprobe.clients.consul import ConsulSettings

    if config_path:
        from azprobe.controller.config import load_config

        config = load_config(config_path)  # ConfigError -> exit 2
        yield ok("config", f"{config_path} is valid")
        yield from consul_checks(config.consul)
        if config.agents.static:
            yield from agents_checks(list(config.agents.static), max(config.agents.pull_timeout_s, 2.0))
        else:
            yield warn("agents", f"discovered through the Consul catalog ({config.agents.service})",
                       "check them with `consul catalog nodes -service azprobe-agent`")
        return
    yield from consul_checks(ConsulSettings.from_env())
    yield warn("agents", "not checked: no --config", "pass --config /etc/azprobe/controller.toml")


def run_checks(role: Role, config_path: str | None) -> list[Check]:
    checks: list[Check] = []
    if role is Role.AGENT:
        collector = "auto"
        if config_path:
            from azprobe.agent.config import load_agent_config

            collector = load_agent_config(config_path).collector  # ConfigError -> exit 2
            checks.append(ok("config", f"{config_path} is valid"))
        bpf_checks = list(agent_checks())
        checks.extend(bpf_checks)
        checks.append(check_collector(bpf_checks, collector))
        # Agents need Consul only when they register for discovery; check it when the
        # operator points at one.
        if os.environ.get("CONSUL_HTTP_ADDR"):
            from azprobe.clients.consul import ConsulSettings

            checks.extend(consul_checks(ConsulSettings.from_env()))
    else:
        checks.extend(controller_checks(config_path))
    return checks


def render_human(checks: list[Check], echo: Callable[[str], None]) -> None:
    for check in checks:
        echo(f"{SYMBOLS[check.status]} {check.name}: {check.detail}")
        if check.status != OK and check.fix:
            echo(f"    fix: {check.fix}")
    failed = sum(c.failed for c in checks)
    warned = sum(c.status == WARN for c in checks)
    verdict = "ready" if not failed else "NOT ready"
    echo(f"{verdict}: {len(checks)} checks, {failed} failed, {warned} warnings")


def report_json(role: Role, checks: list[Check]) -> dict[str, Any]:
    return {"role": role.value, "ok": not any(c.failed for c in checks),
            "checks": [asdict(c) for c in checks]}


@click.command("doctor")
@click.option("--role", type=click.Choice([r.value for r in Role]), default=Role.AGENT.value,
              show_default=True, help="Which daemon this host will run.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="The daemon's config file (/etc/azprobe/agent.toml or controller.toml).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: role, ok, checks.")
def doctor_command(role: str, config_path: str | None, as_json: bool) -> int:
    """Preflight checks for the agent or controller; each problem comes with its fix."""
    chosen = Role(role)
    checks = run_checks(chosen, config_path)
    if as_json:
        click.echo(json.dumps(report_json(chosen, checks)))
    else:
        render_human(checks, click.echo)
    return 1 if any(c.failed for c in checks) else 0
