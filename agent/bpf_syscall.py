"""The few bpf(2) commands BCC does not offer: loading and attaching BTF-typed
tracepoint programs (tp_btf), and holding BPF run-time stats on.

Why tp_btf (docs/probe.md "BTF-typed tracepoints"): the program reads the socket through
its BTF-typed argument with plain loads, where a raw tracepoint's handler must call
bpf_probe_read_kernel (~200 ns a call on the CI machine) and a classic one gets a trace
record the kernel builds for every event. BCC compiles such a handler but cannot load it:
its loader looks tracing programs up as kernel functions (fentry), never as
`btf_trace_<tracepoint>`. So the agent takes the bytecode BCC compiled (map fds already
in it), links the kfunc calls BCC cannot emit, and loads it here. Thin: the syscall,
its attribute layout, and one error line.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Iterator
from contextlib import contextmanager

NR_BPF = {"x86_64": 321, "aarch64": 280}

# include/uapi/linux/bpf.h
BPF_PROG_LOAD = 5
BPF_RAW_TRACEPOINT_OPEN = 17
BPF_ENABLE_STATS = 32
BPF_PROG_TYPE_TRACING = 26
BPF_TRACE_RAW_TP = 23
BPF_STATS_RUN_TIME = 0
BPF_OBJ_NAME_LEN = 16

# union bpf_attr's BPF_PROG_LOAD fields used here: the head at offset 0, the rest by offset.
_PROG_LOAD_HEAD = "<IIQQIIQ"  # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf
_PROG_NAME_AT = 48
_EXPECTED_ATTACH_TYPE_AT = 68
_ATTACH_BTF_ID_AT = 108
_ATTR_SIZE = 144  # covers every field set here; the kernel zero-checks the rest
_LOG_SIZE = 1 << 20


class BPFSyscallError(OSError):
    """A bpf(2) command failed; for a load, the message ends with the verifier's verdict."""


def _syscall(cmd: int, attr: ctypes.Array) -> int:
    nr = NR_BPF.get(platform.machine())
    if nr is None:
        raise BPFSyscallError(errno.ENOSYS, f"no bpf(2) syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    ret = libc.syscall(nr, cmd, attr, ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise BPFSyscallError(err, os.strerror(err))
    return ret


# Lines the verifier ends its log with whatever the verdict: statistics, not reasons.
_LOG_SUMMARY = ("processed ", "verification time", "stack depth")


def verifier_verdict(log: str) -> str:
    """The verifier log's last line that is not a statistic: why it stopped."""
    lines = [line.strip() for line in log.splitlines() if line.strip() and not line.startswith(_LOG_SUMMARY)]
    return lines[-1] if lines else "no verifier log"


BPF_CALL = 0x85  # BPF_JMP | BPF_CALL
BPF_PSEUDO_KFUNC_CALL = 2  # src_reg of a call to a kernel function, imm its BTF id


def link_kfuncs(insns: bytes, kfuncs: dict[int, int]) -> bytes:
    """`insns` with every call of a placeholder helper id (a key of `kfuncs`) turned into
    a call of the kernel function whose vmlinux BTF id is its value. BCC cannot emit a
    kfunc call; a call of an unknown helper id it can, and that is what the program does
    (bpf/azprobe.bpf.c as_tcp_sock). A placeholder left unlinked is refused by the
    verifier as an unknown helper."""
    out = bytearray(insns)
    for at in range(0, len(out) - len(out) % 8, 8):
        code, regs, _off, imm = struct.unpack_from("<BBhi", out, at)
        if code == BPF_CALL and regs >> 4 == 0 and imm in kfuncs:
            struct.pack_into("<BBhi", out, at, code, (regs & 0x0F) | BPF_PSEUDO_KFUNC_CALL << 4, 0, kfuncs[imm])
    return bytes(out)


class TracingProgram:
    """One tp_btf program, loaded (verified) and attachable; close() unloads it."""

    def __init__(self, name: str, prog_fd: int) -> None:
        self.name = name  # the tracepoint, e.g. "tcp_probe"
        self.prog_fd = prog_fd
        self.link_fd: int | None = None

    @classmethod
    def load(cls, tracepoint: str, insns: bytes, attach_btf_id: int) -> "TracingProgram":
        """Verify `insns` as a tp_btf program of `tracepoint` (attach_btf_id: the id of
        the kernel's `btf_trace_<tracepoint>` typedef). BPFSyscallError ends with the
        verifier's verdict when the kernel refuses it."""
        if not insns or len(insns) % 8:
            raise BPFSyscallError(errno.EINVAL, f"tp_btf {tracepoint}: {len(insns)} bytes of bytecode "
                                                "is not whole instructions")
        code = ctypes.create_string_buffer(insns, len(insns))
        license_ = ctypes.create_string_buffer(b"GPL")  # the helpers and kfuncs called are GPL-only

        def load(log: ctypes.Array | None) -> int:
            attr = (ctypes.c_uint8 * _ATTR_SIZE)()
            struct.pack_into(_PROG_LOAD_HEAD, attr, 0, BPF_PROG_TYPE_TRACING, len(insns) // 8,
                             ctypes.addressof(code), ctypes.addressof(license_),
                             *((1, len(log), ctypes.addressof(log)) if log is not None else (0, 0, 0)))
            struct.pack_into(f"{BPF_OBJ_NAME_LEN - 1}s", attr, _PROG_NAME_AT,
                             tracepoint.encode()[:BPF_OBJ_NAME_LEN - 1])
            struct.pack_into("<I", attr, _EXPECTED_ATTACH_TYPE_AT, BPF_TRACE_RAW_TP)
            struct.pack_into("<I", attr, _ATTACH_BTF_ID_AT, attach_btf_id)
            return _syscall(BPF_PROG_LOAD, attr)

        try:  # without a log first: logging makes the verifier slower, and it is only read on refusal
            return cls(tracepoint, load(None))
        except BPFSyscallError:
            log = ctypes.create_string_buffer(_LOG_SIZE)
            try:
                return cls(tracepoint, load(log))  # a refusal is deterministic: this fails too
            except BPFSyscallError as exc:
                raise BPFSyscallError(exc.errno, f"tp_btf {tracepoint} refused ({exc.strerror}): "
                                                 f"{verifier_verdict(log.value.decode('utf-8', 'replace'))}") from None

    def attach(self) -> None:
        """Start running on every hit of the tracepoint (idempotent)."""
        if self.link_fd is None:
            attr = (ctypes.c_uint8 * 16)()
            struct.pack_into("<QI", attr, 0, 0, self.prog_fd)  # name NULL: the load named the tracepoint
            try:
                self.link_fd = _syscall(BPF_RAW_TRACEPOINT_OPEN, attr)
            except BPFSyscallError as exc:
                raise BPFSyscallError(exc.errno, f"attaching tp_btf {self.name}: {exc.strerror}") from None

    def detach(self) -> None:
        if self.link_fd is not None:
            os.close(self.link_fd)
            self.link_fd = None

    def close(self) -> None:
        self.detach()
        if self.prog_fd >= 0:
            os.close(self.prog_fd)
            self.prog_fd = -1


@contextmanager
def run_time_stats() -> Iterator[None]:
    """BPF run-time stats on while this holds. BPF_ENABLE_STATS hands out an fd that keeps
    them on until it is closed, counted per holder (unlike the kernel.bpf_stats_enabled
    sysctl, one switch that a second bench or an operator can turn off mid-run), and a
    killed holder's fd closes with it. Stats add two clock reads to every handler run, so
    only a measurement that needs them holds this."""
    attr = (ctypes.c_uint32 * 2)(BPF_STATS_RUN_TIME, 0)  # enable_stats.type
    fd = _syscall(BPF_ENABLE_STATS, attr)
    try:
        yield
    finally:
        os.close(fd)
