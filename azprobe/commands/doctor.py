"""`azprobe doctor`: the preflight gate. Every check says what it found and, when it is
not fine, the one thing to do about it.

The agent role checks what loading the probe needs (BTF, tracefs, the five
tracepoints, kernel headers, BCC and a real test compile, capabilities). The controller
role checks Consul the way the controller uses it (reachable, a leader, the token
allowed to write and delete under the prefix and to hold a lock session, a sane clock)
and that the configured agents answer. The xds role checks the xDS server's config,
grpcio, its listen address and what it reads from Consul (the weights views, the catalog
services), read-only; the extender role (doctor_extender) the scheduler extender's config,
TLS files, listen address and weights key. Exit 0 when every required check passes, 1 when one fails, 2 for
bad usage or a bad config file.
"""

from __future__ import annotations

import datetime
import email.utils
import importlib
import importlib.machinery
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

from azprobe.contracts.window import printable
from azprobe.errors import AzprobeError, ConfigError

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
    XDS = "xds"
    EXTENDER = "extender"


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
    """(low, high) bounds of local clock minus Consul's clock, in seconds; ValueError
    when `date_header` is not an HTTP date.

    The server stamped Date somewhere between our send and receive, and Date has
    whole-second resolution, so the server's time then lay in [D, D + 1).
    """
    try:
        stamp = email.utils.parsedate_to_datetime(date_header)
        # "-0000" (RFC 5322: UTC, local zone unknown) parses naive, which timestamp() would read as local time.
        server = (stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.timezone.utc)).timestamp()
    except (ValueError, TypeError, OverflowError, OSError):  # a year past 9999 overflows, not ValueError
        raise ValueError(f"\"{printable(date_header, 64)}\" is not an HTTP date") from None
    return sent_at - (server + 1.0), received_at - server


def clock_skew_check(sent_at: float, received_at: float, date_header: str | None) -> Check:
    """The skew judged from Consul's Date header; a missing or unparseable one is a warning,
    never a crash: the header comes from the network."""
    fix = "compare the clocks by hand (`date -u` here and on a Consul server)"
    if not date_header:
        return warn("consul.clock_skew", "Consul sent no Date header: cannot measure clock skew", fix)
    try:
        return judge_skew(*skew_bounds(sent_at, received_at, date_header))
    except ValueError as exc:
        return warn("consul.clock_skew", f"Consul's Date header {exc}: cannot measure clock skew", fix)


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


def consul_checks(settings: Any, *, write: bool = True) -> Iterator[Check]:
    """Reachable + leader + clock skew from one request, then (write) the ACL write path
    and a lock session. Stops at the first failure: later checks would only repeat it."""
    import requests

    from azprobe.clients import consul as kv

    leader_url = settings.address + "/v1/status/leader"
    token = settings.current_token()
    headers = {"X-Consul-Token": token} if token else {}
    sent_at = time.time()
    try:
        response = kv.http_session(settings).get(leader_url, headers=headers, timeout=5.0)
    except requests.exceptions.RequestException as exc:
        tls_failure = kv.consul_tls.describe_failure(exc, settings.address, "reading /v1/status/leader")
        yield fail("consul.reachable", tls_failure or f"no answer from {leader_url}: {type(exc).__name__}",
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
    yield ok("consul.leader", f"leader {printable(leader, 80)}")

    yield clock_skew_check(sent_at, received_at, response.headers.get("Date"))

    if write:
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


def agents_transport_check(agents: Any) -> Check:
    """Plain HTTP from an address off this host: anyone on the path can rewrite an agent's
    answer, and the quorum would count it as that node's."""
    if agents.tls is not None:
        return ok("agents.transport", f"mutual TLS; an answer must come with the SAN {agents.identity!r}")
    if agents.source != "direct":
        return ok("agents.transport", "agents are read through Prometheus")
    remote = [u for u in agents.static if u.startswith("http://") and not _loopback_url(u)]
    if agents.discover == "consul":
        remote.append(f"the catalog's {agents.service!r} instances")
    if not remote:
        return ok("agents.transport", "plain HTTP, to loopback agents only")
    return warn("agents.transport", f"pulls plain HTTP from non-loopback agents ({remote[0]}"
                f"{f' and {len(remote) - 1} more' if len(remote) > 1 else ''}): a host on the path can rewrite "
                "their answers, and nothing proves which node answered",
                "give the agents [agent.tls] and the controller [agents.tls] and agents.identity "
                "(docs/operations.md, \"Mutual TLS\")")


def _loopback_url(url: str) -> bool:
    import ipaddress
    import urllib.parse

    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def agents_tls_checks(agents: Any, timeout_s: float) -> Iterator[Check]:
    """The controller's certificate loads, and each static agent answers /healthz over
    mutual TLS with the controller's own context."""
    import urllib.request

    from azprobe.security.tls import identity_client_context

    try:
        context = identity_client_context(agents.tls, "agents.tls")
    except ConfigError as exc:
        yield fail("agents.tls", str(exc), "fix the file it names")
        return
    yield ok("agents.tls", f"client certificate {agents.tls.cert_file} and CA {agents.tls.ca_file} load")
    results = []
    for url in agents.static:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=timeout_s, context=context) as response:  # noqa: S310
                results.append(ok(f"agent {url}", f"/healthz answered {response.status} over mutual TLS"))
        except (OSError, ValueError) as exc:
            results.append(warn(f"agent {url}", f"no answer over mutual TLS: {printable(str(exc), 200)}",
                                "check the agent's [agent.tls] (its ca_file must have signed agents.tls.cert_file)"))
    yield from results
    if results and all(r.status != OK for r in results):
        yield fail("agents", f"none of the {len(results)} agents answered", "start the agents, or fix agents.static")


def compiled_check(module: Any) -> Check:
    """Whether the controller's per-cycle modules run compiled (setup.py), judged by one of
    them (`module`): the build compiles all of them or none."""
    built = str(getattr(module, "__file__", None) or "")
    if built.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        return ok("compiled", "the cycle's modules run compiled (mypyc)")
    return warn("compiled", "the cycle's modules run as plain Python (installed with AZPROBE_COMPILE=0, or not "
                "built): about 1.6 times the CPU a cycle",
                "reinstall on a host with gcc and python3-dev (make install), see docs/operations.md \"Install\"")


def controller_checks(config_path: str | None) -> Iterator[Check]:
    from azprobe.clients.consul import ConsulSettings
    from azprobe.controller import window_store

    yield compiled_check(window_store)
    if config_path:
        from azprobe.controller.config import load_config

        config = load_config(config_path)  # ConfigError -> exit 2
        yield ok("config", f"{config_path} is valid")
        yield from consul_checks(config.consul)
        yield agents_transport_check(config.agents)
        if config.agents.tls is not None:
            yield from agents_tls_checks(config.agents, max(config.agents.pull_timeout_s, 2.0))
        elif config.agents.static:
            yield from agents_checks(list(config.agents.static), max(config.agents.pull_timeout_s, 2.0))
        else:
            yield warn("agents", f"discovered through the Consul catalog ({config.agents.service})",
                       "check them with `consul catalog nodes -service azprobe-agent`")
        return
    yield from consul_checks(ConsulSettings.from_env())
    yield warn("agents", "not checked: no --config", "pass --config /etc/azprobe/controller.toml")


def xds_checks(config_path: str | None) -> Iterator[Check]:
    """The xDS server's needs: its config, grpcio and the protos, the listen address,
    Consul readable (the weights views, the catalog services). Read-only: the server
    never writes to Consul."""
    if not config_path:
        yield fail("config", "no --config", "pass --config /etc/azprobe/xds.toml")
        return
    from azprobe.clients import consul as kv
    from azprobe.contracts import kv as keys
    from azprobe.consumers.xds.config import UNIX_PREFIX, load_xds_config

    settings = load_xds_config(config_path)  # ConfigError -> exit 2
    yield ok("config", f"{config_path} is valid: {len(settings.services)} service(s), "
                       f"views global{''.join(', ' + z for z in settings.views)}")
    try:
        importlib.import_module("grpc")
        importlib.import_module("envoy.service.discovery.v3.ads_pb2_grpc")
        yield ok("grpc", "grpcio and the Envoy v3 protos (xds-protos) import")
    except ImportError as exc:
        yield fail("grpc", f"cannot import {exc.name}", "reinstall azprobe (it depends on grpcio and xds-protos)")
    yield from _xds_listen_check(settings.listen, UNIX_PREFIX)
    yield from _xds_tls_check(settings.tls)
    consul = list(consul_checks(settings.consul, write=False))
    yield from consul
    if any(c.failed for c in consul):
        return
    yield from _xds_consul_reads(settings)


def _xds_tls_check(files: Any) -> Iterator[Check]:
    """[xds.tls] loads as the server will load it (the same builder, the same checks)."""
    if files is None:
        yield ok("xds.tls", "off: plaintext gRPC")
        return
    from azprobe.security.tls import server_pem

    try:
        server_pem(files, "xds.tls")
    except ConfigError as exc:
        yield fail(exc.field, exc.problem, exc.fix or "fix the file")
        return
    yield ok("xds.tls", "certificate and key load" + (", client certificates required (mTLS)" if files.ca_file else ""))


def _xds_listen_check(listen: str, unix_prefix: str) -> Iterator[Check]:
    """The xDS listen address can be taken: a unix socket's directory, or a free port."""
    if listen.startswith(unix_prefix):
        directory = Path(listen[len(unix_prefix):]).parent
        if directory.is_dir() and os.access(directory, os.W_OK | os.X_OK):
            yield ok("xds.listen", f"can create the socket in {directory}")
        else:
            yield fail("xds.listen", f"cannot create a socket in {directory}",
                       "create the directory, writable by the service (RuntimeDirectory= in the unit)")
    else:
        host, _, port = listen.rpartition(":")
        yield bind_check("xds.listen", host.strip("[]"), int(port))


def bind_check(field: str, host: str, port: int) -> Check:
    """A daemon's TCP listen address is free to bind (port 0: any port is)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return fail(field, f"cannot bind {shown}: {exc.strerror}", f"stop what holds it, or change {field}")
    return ok(field, f"{shown} is free")


def _xds_consul_reads(settings: Any) -> Iterator[Check]:
    """Each weights view and each catalog service the xDS server reads, read once."""
    from azprobe.clients import consul as kv
    from azprobe.contracts import kv as keys

    client = kv.make_client(settings.consul)
    for view in (None, *settings.views):
        key = settings.consul.key(keys.weights_name(view))
        try:
            state = kv.read_key(client, key)
        except kv.ConsulError as exc:
            yield fail(f"weights {view or 'global'}", f"cannot read {key}: {exc}",
                       f'give the token key_prefix "{settings.consul.prefix}" {{ policy = "read" }}')
            continue
        if state.value is None:
            yield warn(f"weights {view or 'global'}", f"{key} is absent: this view serves "
                       + ("equal weights" if view is None else "the global document"),
                       "start the controllers (or check consul.prefix)")
        else:
            yield ok(f"weights {view or 'global'}", f"{key} is present")
    for service in settings.services:
        if service.consul_service is None:
            yield ok(f"service {service.name}", f"{sum(map(len, service.static.values()))} static endpoints")
            continue
        try:
            found = kv.read_service(client, service.consul_service)
        except kv.ConsulError as exc:
            yield fail(f"service {service.name}", str(exc), 'give the token service_prefix "" { policy = "read" } '
                                                            'and node_prefix "" { policy = "read" }')
            continue
        if not found.instances:
            yield warn(f"service {service.name}", f"no passing instance of {service.consul_service!r}",
                       "register the service, or check its health checks")
        else:
            yield ok(f"service {service.name}", f"{len(found.instances)} passing instance(s)")



def run_checks(role: Role, config_path: str | None) -> list[Check]:
    checks: list[Check] = []
    if role is Role.XDS:
        return list(xds_checks(config_path))
    if role is Role.EXTENDER:
        from azprobe.commands.doctor_extender import extender_checks

        return list(extender_checks(config_path))
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
              help="The daemon's config file (/etc/azprobe/agent.toml, controller.toml, xds.toml or "
                   "scheduler-extender.toml).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: role, ok, checks.")
def doctor_command(role: str, config_path: str | None, as_json: bool) -> int:
    """Preflight checks for the agent, controller, xDS server or scheduler extender; each problem
    comes with its fix."""
    chosen = Role(role)
    checks = run_checks(chosen, config_path)
    if as_json:
        click.echo(json.dumps(report_json(chosen, checks)))
    else:
        render_human(checks, click.echo)
    return 1 if any(c.failed for c in checks) else 0
