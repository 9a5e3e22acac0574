"""The kernel side's thin shell: load bpf/azprobe.bpf.c with BCC once, fill the LPM trie,
read the per-CPU maps as cumulative Snapshots and drain the ring buffer of events."""

from __future__ import annotations

import ctypes
import errno
import importlib
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from azprobe import bpf
from azprobe.agent import btf
from azprobe.agent.bpf_syscall import BPFSyscallError, TracingProgram, link_kfuncs
from azprobe.agent.config import DEFAULT_MAX_HOSTS, DEFAULT_RTT_SAMPLE_TICKS, MAX_HOSTS_LIMIT, RTT_SAMPLE_TICKS
from azprobe.agent.hosts import HostKey, HostLedger
from azprobe.agent.lpm import TrieEntry
from azprobe.agent.windows import BPF_COUNTER_FIELDS, Snapshot, address_text
from azprobe.contracts.window import HOST_COUNTER_FIELDS
from azprobe.errors import PrerequisiteError

log = logging.getLogger(__name__)

TRACEFS = Path("/sys/kernel/tracing")
PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
BTF_VMLINUX = btf.VMLINUX_BTF
TRACEPOINTS = ("tcp/tcp_probe", "tcp/tcp_retransmit_skb", "tcp/tcp_cong_state_set",
               "tcp/tcp_receive_reset", "sock/inet_sock_set_state")

# struct azp_flow_slot (bpf/azprobe.h): saddr_hi, saddr_lo, daddr_hi, daddr_lo, dport, valid, path.
FLOW_SLOT = struct.Struct("=QQQQHHI")

EVENT_KINDS = {
    bpf.constant("EV_SYN_RETRANS"): "syn_retrans",
    bpf.constant("EV_RTO"): "rto",
    bpf.constant("EV_SYN_RTO"): "syn_rto",
    bpf.constant("EV_CONN_REFUSED"): "conn_refused",
    bpf.constant("EV_CONN_TIMEOUT"): "conn_timeout",
}


def check_prerequisites() -> None:
    """Raise PrerequisiteError naming the first missing prerequisite and its fix."""
    if os.geteuid() != 0:
        raise PrerequisiteError("not root: loading BPF needs root (CAP_BPF, CAP_PERFMON); run the agent as root")
    if not BTF_VMLINUX.exists():
        raise PrerequisiteError(f"no BTF: {BTF_VMLINUX} is missing; use a kernel built with CONFIG_DEBUG_INFO_BTF=y")
    if not (TRACEFS / "events").is_dir():
        raise PrerequisiteError(f"tracefs not mounted at {TRACEFS}: run `mount -t tracefs nodev {TRACEFS}`")
    for tp in TRACEPOINTS:
        if not (TRACEFS / "events" / tp / "format").exists():
            raise PrerequisiteError(f"kernel lacks tracepoint {tp.replace('/', ':')}: azprobe needs Linux >= 5.15")
    try:
        importlib.import_module("bcc")
    except ImportError:
        raise PrerequisiteError("bcc not importable (python3-bpfcc): run `make setup`") from None
    build = Path("/lib/modules") / os.uname().release / "build"
    if not build.exists():
        raise PrerequisiteError(f"kernel headers link missing: {build}; run `make setup`")


def tracepoint_has_field(tracepoint: str, field_name: str) -> bool:
    try:
        fmt = (TRACEFS / "events" / tracepoint / "format").read_text()
    except OSError:
        return False
    return any(f" {field_name};" in line for line in fmt.splitlines() if line.strip().startswith("field:"))


def ephemeral_port_cflags(path: Path = PORT_RANGE) -> list[str]:
    """-D flags with the node's ephemeral port range: tcp_probe drops segments of sockets
    whose local port is outside it (accepted sockets) without touching a map. No flags,
    so no filter, when the range is unreadable."""
    try:
        lo, hi = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        log.warning("cannot read %s: tcp_probe looks up every segment's flow", path)
        return []
    return [f"-DAZP_EPHEMERAL_LO={lo}", f"-DAZP_EPHEMERAL_HI={hi}"]


# Compiles the tp_btf handlers of bpf/azprobe.bpf.c and bpf/empty.bpf.c, not the classic ones.
BTF_HOOKS_FLAG = "-DAZP_BTF_HOOKS"


@dataclass(frozen=True)
class BtfHooks:
    """What the BTF-typed (tp_btf) handlers need from the running kernel's BTF."""
    cflags: tuple[str, ...]      # -DAZP_BTF_HOOKS, the socket offsets they read, the tcp_sock type
    attach_ids: dict[str, int]   # tracepoint -> its btf_trace_<tracepoint> typedef id
    kfuncs: dict[int, int]       # placeholder helper id -> kfunc BTF id (bpf_syscall.link_kfuncs)


def btf_hooks(path: Path = btf.VMLINUX_BTF) -> BtfHooks | None:
    """The tp_btf hooks' build flags and attach points from the kernel's BTF. None, with
    one log line saying why, when the BTF cannot give them: the program then hooks the
    classic tracepoints (docs/probe.md "BTF-typed tracepoints")."""
    try:
        kernel = btf.BTF.from_file(path)
        offsets, attach_ids = btf.tp_btf_requirements(kernel)
    except btf.BTFError as exc:
        log.warning("hooks: classic tracepoints, not BTF-typed ones (%s)", exc)
        return None
    cflags = [BTF_HOOKS_FLAG, *(f"-D{name}={offset}" for name, offset in offsets.items())]
    try:  # Linux >= 6.2; without it tcp_probe types the socket with a helper instead
        kfuncs = {bpf.constant("KFUNC_RDONLY_CAST"): kernel.function_id("bpf_rdonly_cast")}
        cflags.append(f"-DAZP_TCP_SOCK_BTF_ID={kernel.struct_id('tcp_sock')}")
    except btf.BTFError as exc:
        log.info("tcp_probe: bpf_skc_to_tcp_sock, not bpf_rdonly_cast (%s)", exc)
        kfuncs = {}
    return BtfHooks(tuple(cflags), attach_ids, kfuncs)


BTF_HANDLER_PREFIX = b"tp_btf__"


def load_btf_handlers(program: object, hooks: BtfHooks, attach: bool = True) -> list[TracingProgram]:
    """Load (verify) every tp_btf__<tracepoint> function BCC compiled into `program`, and
    attach them unless `attach` is false. BCC cannot load them (agent/bpf_syscall.py says
    why). All or none: BPFSyscallError, with the verifier's verdict, after unloading any
    already loaded."""
    from bcc.libbcc import lib  # noqa: PLC0415

    names = [lib.bpf_function_name(program.module, i) for i in range(lib.bpf_num_functions(program.module))]
    handlers: list[TracingProgram] = []
    try:
        for name in names:
            if name.startswith(BTF_HANDLER_PREFIX):
                tracepoint = name[len(BTF_HANDLER_PREFIX):].decode()
                code = link_kfuncs(program.dump_func(name), hooks.kfuncs)
                handlers.append(TracingProgram.load(tracepoint, code, hooks.attach_ids[tracepoint]))
        for handler in handlers if attach else ():
            handler.attach()
    except BPFSyscallError:
        for handler in handlers:
            handler.close()
        raise
    return handlers


def compile_program(source: str, extra_cflags: Iterable[str] = ()) -> object:
    """Compile and attach one program of bpf/ with BCC; errors become PrerequisiteError."""
    from bcc import BPF  # noqa: PLC0415 - heavy, and only the agent needs it

    # Test-only: point the loader at another program directory (e.g. a broken one, to
    # exercise the agent's fallback where BCC cannot build).
    src_dir = Path(os.environ.get("AZPROBE_TEST_BPF_DIR") or bpf.source_dir())
    cflags = [f"-I{src_dir}", *extra_cflags]
    try:
        return BPF(src_file=str(src_dir / source).encode(), cflags=cflags)
    except Exception as exc:  # BCC raises bare Exception for compile/verify failures
        raise PrerequisiteError(f"cannot load BPF program {source}: {str(exc).splitlines()[0]}") from exc


def load_program(cflags: list[str], hooks: BtfHooks | None) -> tuple[object, list[TracingProgram]]:
    """Compile bpf/azprobe.bpf.c and attach it: on tp_btf hooks where `hooks` is given and
    the kernel takes them, else on classic tracepoints, with one log line saying why."""
    if hooks is not None:
        program = compile_program(bpf.PROGRAM, [*cflags, *hooks.cflags])
        try:
            return program, load_btf_handlers(program, hooks)
        except BPFSyscallError as exc:
            program.cleanup()
            log.warning("hooks: classic tracepoints, not BTF-typed ones (%s)", exc.strerror)
    return compile_program(bpf.PROGRAM, cflags), []


def _handler_fdinfo(program: object, btf_handlers: Iterable[TracingProgram]) -> dict[str, dict[str, str]]:
    """Each loaded handler's /proc/self/fdinfo fields (BCC's and the tp_btf ones loaded
    beside it), by tracepoint."""
    out = {}
    loaded = [(f.name.decode() if isinstance(f.name, bytes) else f.name, f.fd) for f in program.funcs.values()]
    for name, fd in loaded + [(h.name, h.prog_fd) for h in btf_handlers]:
        fields = {}
        try:
            for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        except OSError:
            continue
        out[name.rsplit("__", 1)[-1]] = fields
    return out


def program_stats(program: object, btf_handlers: Iterable[TracingProgram] = ()) -> dict[str, tuple[int, int]]:
    """Cumulative run time and run count of each loaded handler, by tracepoint (the
    kernel fills them only while bpf_stats are on)."""
    return {name: (int(fields["run_time_ns"]), int(fields.get("run_cnt", 0)))
            for name, fields in _handler_fdinfo(program, btf_handlers).items() if "run_time_ns" in fields}


def handler_misses(program: object, btf_handlers: Iterable[TracingProgram] = ()) -> int:
    """Runs of the handlers the kernel skipped since load, all handlers summed. The
    kernel's recursion guard does not start a handler on a CPU where it holds one running
    (a classic tracepoint's: any tracing program there, or a map read copying a value
    out, e.g. one a timer interrupted), so what the run would have counted is lost.
    fdinfo's recursion_misses counts them, with or without bpf_stats."""
    return sum(int(fields.get("recursion_misses", 0)) for fields in _handler_fdinfo(program, btf_handlers).values())


@dataclass(frozen=True)
class ProbeEvent:
    ts_ns: int
    kind: str
    src_az_id: int
    dst_az_id: int
    saddr: str
    sport: int
    daddr: str
    dport: int


def read_counts(program: object, table: str, keys: Iterable[int], width: int, per_cpu: bool) -> dict[int, list[int]]:
    """Rows of `width` u64 counters of array `table`, one lookup syscall per key,
    CPUs summed for a per-CPU array."""
    from bcc.libbcc import lib  # noqa: PLC0415
    from bcc.utils import get_possible_cpus  # noqa: PLC0415

    fd = program[table.encode()].map_fd
    ncpu = len(get_possible_cpus()) if per_cpu else 1
    values = (ctypes.c_uint64 * (width * ncpu))()
    flat = memoryview(values).cast("B").cast("Q")
    rows = {}
    for index in keys:
        key = ctypes.c_uint32(index)
        if lib.bpf_lookup_elem(fd, ctypes.byref(key), values) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"reading {table}[{index}]: {os.strerror(err)}")
        sums = flat[0:width].tolist()
        for cpu in range(1, ncpu):
            sums = [a + b for a, b in zip(sums, flat[cpu * width:(cpu + 1) * width].tolist())]
        rows[index] = sums
    return rows


def flow_rows(program: object) -> dict[int, tuple[HostKey | None, list[int]]]:
    """The flow-cache slots that hold a flow: the host it goes to and the slot's srtt
    samples by host RTT bucket, CPUs summed. Empty slots are not read (most are):
    HostLedger takes a slot's first reading as its baseline."""
    table = program[b"flow_cache"]
    if ctypes.sizeof(table.Leaf) != FLOW_SLOT.size:  # the layout changed in azprobe.h but not here
        raise RuntimeError(f"struct azp_flow_slot is {ctypes.sizeof(table.Leaf)} bytes, FLOW_SLOT {FLOW_SLOT.size}")
    raw = bytes(read_array(table))
    owners: dict[int, HostKey] = {}
    for index, (_, _, daddr_hi, daddr_lo, _, valid, path) in enumerate(FLOW_SLOT.iter_unpack(raw)):
        if valid:
            owners[index] = (path, struct.pack("<QQ", daddr_hi, daddr_lo))
    rows = read_counts(program, "flow_rtt", owners, bpf.constant("HOST_RTT_BUCKETS"), per_cpu=True)
    return {index: (owners[index], row) for index, row in rows.items()}


def read_array(table: object) -> ctypes.Array:
    """Every value of BPF array `table` in one batch syscall."""
    from bcc.libbcc import lib  # noqa: PLC0415

    size = table.max_entries
    keys, values = (table.Key * size)(), (table.Leaf * size)()
    count, out_batch = ctypes.c_uint32(size), ctypes.c_uint32(0)
    if lib.bpf_lookup_batch(table.map_fd, None, ctypes.byref(out_batch), ctypes.byref(keys),
                            ctypes.byref(values), ctypes.byref(count)) != 0 and ctypes.get_errno() != errno.ENOENT:
        err = ctypes.get_errno()
        raise OSError(err, f"reading a BPF array in one batch: {os.strerror(err)}")
    return values


class Probe:
    """One loaded azprobe program. Load once per process: BCC costs ~1 s and ~140 MB."""

    source = "bpf"  # the window's `source`: which collector made it

    def __init__(self, program: object, btf_handlers: Iterable[TracingProgram], rtt_sample_ticks: int,
                 max_hosts: int = DEFAULT_MAX_HOSTS) -> None:
        self.bpf = program
        self.rtt_sample_ticks = rtt_sample_ticks  # RTT samples come from one tick in this many
        self.max_hosts = max_hosts  # the `hosts` table's size; 0: no host evidence
        self.host_ledger = HostLedger()
        # The tp_btf handlers, loaded beside BCC's (docs/probe.md "BTF-typed tracepoints").
        self.btf_handlers = list(btf_handlers)
        self._on_event: Callable[[ProbeEvent], None] | None = None

    @classmethod
    def load(cls, rtt_sample_ticks: int = DEFAULT_RTT_SAMPLE_TICKS,
             connect_set_bits: int | None = None, btf_path: Path = btf.VMLINUX_BTF,
             max_hosts: int = DEFAULT_MAX_HOSTS) -> "Probe":
        """Compile and attach the program; `rtt_sample_ticks` (a power of two, `[agent]
        rtt_sample_ticks`): tcp_probe samples one kernel tick in that many, 1 = every segment.
        `max_hosts` (`[agent] max_hosts`): the per-destination-host table's size, 0: none.
        `connect_set_bits`: log2 of the sets of connects in flight (default: azprobe.h's);
        tests shrink it to fill a set on purpose. `btf_path`: the kernel's BTF, for the
        tp_btf hooks (tests point it at nothing to get the classic hooks)."""
        if rtt_sample_ticks not in RTT_SAMPLE_TICKS:
            raise ValueError(f"rtt_sample_ticks must be one of {RTT_SAMPLE_TICKS}, not {rtt_sample_ticks}")
        if connect_set_bits is None:
            connect_set_bits = bpf.constant("CONNECT_SET_BITS")
        if not 0 <= connect_set_bits <= 16:
            raise ValueError(f"connect_set_bits must be 0..16, not {connect_set_bits}")
        if not 0 <= max_hosts <= MAX_HOSTS_LIMIT:
            raise ValueError(f"max_hosts must be 0..{MAX_HOSTS_LIMIT}, not {max_hosts}")
        check_prerequisites()
        cflags = [f"-DAZP_RTT_SAMPLE_MASK={rtt_sample_ticks - 1}", f"-DAZP_CONNECT_SET_BITS={connect_set_bits}",
                  f"-DAZP_MAX_HOSTS={max_hosts}"]
        if tracepoint_has_field("tcp/tcp_retransmit_skb", "err"):
            cflags.append("-DAZP_HAVE_RETRANSMIT_ERR")
        cflags += ephemeral_port_cflags()
        probe = cls(*load_program(cflags, btf_hooks(btf_path)), rtt_sample_ticks=rtt_sample_ticks,
                    max_hosts=max_hosts)
        log.info("hooks: %s tracepoints", "BTF-typed" if probe.btf_handlers else "classic")
        return probe

    @property
    def hooks(self) -> str:
        """Which tracepoints the handlers hook: "btf" (tp_btf) or "classic"."""
        return "btf" if self.btf_handlers else "classic"

    # -- topology ------------------------------------------------------------------
    def set_topology(self, entries: list[TrieEntry], own_az_id: int) -> None:
        """Replace the trie's contents (new entries first, then stale ones removed) and
        the agent's own AZ, and forget cached flow paths; the program keeps running."""
        trie = self.bpf[b"az_trie"]
        wanted = {}
        for e in entries:
            key = trie.Key(e.prefixlen, (ctypes.c_ubyte * 16)(*e.addr))
            wanted[(e.prefixlen, e.addr)] = key
            trie[key] = trie.Leaf(e.az_id)
        for key in list(trie.keys()):
            if (key.prefixlen, bytes(key.addr)) not in wanted:
                try:
                    del trie[key]
                except KeyError:
                    pass
        config = self.bpf[b"agent_config"]
        leaf = config.Leaf()
        leaf.own_az = own_az_id
        config[ctypes.c_int(0)] = leaf
        # Cached flow -> path answers may be stale now; flows re-enter on their next connect.
        self.bpf[b"flow_cache"].clear()

    @property
    def lost_events(self) -> int:
        """Events the ring buffer had no room for (counted by the program), since load."""
        return sum(cpu.ring_drops for cpu in self.bpf[b"probe_stats"][ctypes.c_int(0)])

    @property
    def untracked_connects(self) -> int:
        """Connects whose outcome the program could not track (their set of the
        `connecting` array was full; bpf/azprobe.h), since load. Counted as attempts,
        with no outcome: docs/probe.md "What a connection costs"."""
        return sum(cpu.untracked_connects for cpu in self.bpf[b"probe_stats"][ctypes.c_int(0)])

    @property
    def hosts_dropped(self) -> int:
        """Host summaries not kept since load: connects to a host the full `hosts` table
        had no room for (counted by the program), and readings of samples whose host was
        not in the table (HostLedger.dropped)."""
        return sum(cpu.hosts_dropped for cpu in self.bpf[b"probe_stats"][ctypes.c_int(0)]) + self.host_ledger.dropped

    def set_node_addresses(self, keys: list[bytes]) -> None:
        """Keep only sockets whose local address is one of `keys` (16-byte trie form,
        agent.lpm.address_key); none: every socket. The filter goes on only once the
        addresses are in, and off before they go, so no window counts a half-set filter."""
        addrs = self.bpf[b"node_addrs"]
        flag = self.bpf[b"node_filter"]
        wanted = set(keys)
        if not wanted:
            flag[ctypes.c_int(0)] = ctypes.c_uint32(0)
        for key in wanted:
            addrs[addrs.Key((ctypes.c_ubyte * 16)(*key))] = addrs.Leaf(1)
        for key in list(addrs.keys()):
            if bytes(key.addr) not in wanted:
                try:
                    del addrs[key]
                except KeyError:
                    pass
        if wanted:
            flag[ctypes.c_int(0)] = ctypes.c_uint32(1)
        # A cached flow skips the address check at its next connect: forget them all.
        self.bpf[b"flow_cache"].clear()

    def trie_size(self) -> int:
        return len(list(self.bpf[b"az_trie"].keys()))

    # -- reading -------------------------------------------------------------------
    @staticmethod
    def _items(table) -> list:
        try:
            return list(table.items_lookup_batch())
        except Exception:  # kernels or maps without batch ops
            return table.items()

    def _read_rows(self, table: str, paths: Iterable[int], per_cpu: bool) -> dict[int, dict[int, int]]:
        """Histogram rows (struct azp_hist_row: NUM_BUCKETS counters per path) of `table`,
        CPUs summed for a per-CPU array; only non-empty rows."""
        rows = {}
        for path, sums in read_counts(self.bpf, table, paths, bpf.constant("NUM_BUCKETS"), per_cpu).items():
            row = {i: n for i, n in enumerate(sums) if n}
            if row:
                rows[path] = row
        return rows

    def snapshot(self, rtt_paths: Iterable[int] = ()) -> Snapshot:
        """Cumulative counters and histograms; RTT rows only for `rtt_paths` (the paths
        between known AZs: reading all AZP_MAX_PATHS rows every interval is wasted work),
        connect-latency rows for the paths that completed a connect."""
        snap = Snapshot(lost_events=self.lost_events)
        rtt_kind = bpf.constant("HIST_RTT")
        for path, row in self._read_rows("rtt_rows", rtt_paths, per_cpu=True).items():
            snap.hists[(path, rtt_kind)] = row
        for key, per_cpu in self._items(self.bpf[b"path_counters"]):
            sums = dict.fromkeys(BPF_COUNTER_FIELDS, 0)
            for cpu_value in per_cpu:
                for name in BPF_COUNTER_FIELDS:
                    sums[name] += getattr(cpu_value, name)
            if any(sums.values()):  # an array has every path; only used ones matter
                snap.counters[getattr(key, "value", key)] = sums
        connect_kind = bpf.constant("HIST_CONNECT")
        connected = [path for path, sums in snap.counters.items() if sums["conn_ok"]]
        for path, row in self._read_rows("connect_rows", connected, per_cpu=False).items():
            snap.hists[(path, connect_kind)] = row
        if self.max_hosts:
            snap.hosts = self._read_hosts()
        snap.hosts_dropped = self.hosts_dropped
        return snap

    def _read_hosts(self) -> dict[tuple[int, bytes, int], tuple[int, ...]]:
        """The hosts' cumulative values (agent/hosts.py), after deleting the idle ones
        from the table. A connect counted on a host between this read and its deletion is
        lost: that host had been idle for a minute."""
        table = self.bpf[b"hosts"]
        counters: dict[HostKey, tuple[int, ...]] = {}
        for key, per_cpu in self._items(table):
            counters[(key.path, bytes(key.addr))] = tuple(sum(getattr(cpu, name) for cpu in per_cpu)
                                                          for name in HOST_COUNTER_FIELDS)
        readings, idle = self.host_ledger.read(counters, flow_rows(self.bpf), time.monotonic())
        for path, addr in idle:
            try:
                del table[table.Key(path, 0, (ctypes.c_ubyte * 16)(*addr))]
            except KeyError:
                pass
        return readings

    # -- events --------------------------------------------------------------------
    def open_events(self, on_event: Callable[[ProbeEvent], None]) -> None:
        """Deliver events to `on_event` (replacing an earlier receiver: the ring buffer
        is opened once per probe, so agents can take turns on one loaded program)."""
        first = self._on_event is None
        self._on_event = on_event
        if not first:
            return
        max_az = bpf.constant("MAX_AZ")

        # No reference to the table is kept here: BCC's cleanup must be able to free it
        # while the map fd is still open.
        def handle(_ctx: int, data: int, _size: int) -> None:
            raw = self.bpf[b"events"].event(data)
            src, dst = divmod(raw.path, max_az)
            receiver = self._on_event
            if receiver is not None:
                receiver(ProbeEvent(ts_ns=raw.ts_ns, kind=EVENT_KINDS.get(raw.kind, str(raw.kind)),
                                    src_az_id=src, dst_az_id=dst, saddr=address_text(raw.saddr),
                                    sport=raw.sport, daddr=address_text(raw.daddr), dport=raw.dport))

        self.bpf[b"events"].open_ring_buffer(handle)

    def poll_events(self, timeout_ms: int) -> None:
        if self._on_event is None:
            return
        self.bpf.ring_buffer_poll(timeout=max(0, int(timeout_ms)))

    def program_stats(self) -> dict[str, tuple[int, int]]:
        """Handler name (e.g. "tcp_probe") -> (run_time_ns, run_cnt) from bpf_stats."""
        return program_stats(self.bpf, self.btf_handlers)

    @property
    def handler_misses(self) -> int:
        """Handler runs the kernel skipped since load (handler_misses)."""
        return handler_misses(self.bpf, self.btf_handlers)

    def close(self) -> None:
        for handler in self.btf_handlers:
            handler.close()
        self.btf_handlers = []
        self.bpf.cleanup()
