"""Do the daemons still work inside their units' sandbox? There is no systemd as PID 1
here, so the test rebuilds the parts of each unit that can break a daemon, from the unit
file itself, with the same kernel mechanisms systemd uses:

- CapabilityBoundingSet     -> `setpriv --bounding-set` (uid 0 for the agent, nobody for
                               the controller, standing in for DynamicUser)
- NoNewPrivileges           -> prctl(PR_SET_NO_NEW_PRIVS)
- SystemCallFilter lines    -> a seccomp allow list (groups expanded by
                               `systemd-analyze syscall-filter`), EPERM otherwise
- MemoryDenyWriteExecute    -> seccomp: no W+X mmap, no PROT_EXEC mprotect (systemd's rules)
- RestrictAddressFamilies   -> seccomp on socket()'s family
- ProtectSystem=strict, ProtectKernelTunables -> a mount namespace with /, /sys and
                               /sys/kernel/tracing read-only
Not rebuilt: the other namespace options (PrivateTmp, ProtectHome, PrivateDevices ...),
which hide paths the daemons never touch. A self-check proves the sandbox bites before
a daemon is run inside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.request
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import child_url, refused_port, require, require_root, require_tools, wait_for

ROOT = Path(__file__).resolve().parents[2]
UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")

# Another architecture is not a missing prerequisite (the filters below are x86_64's): skip.
pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers are x86_64's")


@pytest.fixture(autouse=True)
def _prerequisites() -> None:
    """Skipped on a developer's box, a failure under CI (tests.helpers.require)."""
    require_root("namespaces and setpriv")
    require(UNISTD.exists(), f"{UNISTD} (the syscall numbers)", "apt-get install linux-libc-dev")
    require_tools("systemd-analyze", "unshare", "setpriv")

AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EPERM, EAFNOSUPPORT = 1, 97
FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
NR_MMAP, NR_MPROTECT, NR_SOCKET, NR_PKEY_MPROTECT = 9, 10, 41, 329


# --- the unit file -> sandbox parameters ------------------------------------------------

def unit_values(unit: str, key: str) -> list[str]:
    text = (ROOT / "systemd" / unit).read_text()
    return [m.group(1).strip() for m in re.finditer(rf"^{key}=(.*)$", text, re.MULTILINE)]


@cache
def syscall_numbers() -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)", UNISTD.read_text())}


@cache
def expand(name: str) -> frozenset[str]:
    if not name.startswith("@"):
        return frozenset({name})
    out = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    members = [line.strip() for line in out[1:] if line.strip() and not line.strip().startswith("#")]
    return frozenset().union(*(expand(m) for m in members))


def allowed_syscalls(unit: str) -> set[str]:
    """systemd's order: the first SystemCallFilter= is an allow list; a later `~` line
    removes from it, a later plain line adds back."""
    lines = unit_values(unit, "SystemCallFilter")
    assert lines and not lines[0].startswith("~")
    allowed: set[str] = set()
    for line in lines:
        deny = line.startswith("~")
        names = set().union(*(expand(n) for n in line.lstrip("~").split()))
        allowed = allowed - names if deny else allowed | names
    return allowed


def seccomp_program(unit: str) -> bytes:
    """Classic BPF for SECCOMP_MODE_FILTER (struct sock_filter: u16 code, u8 jt, u8 jf, u32 k)."""
    ld_abs, jeq, jset, ret, alu_and = 0x20, 0x15, 0x45, 0x06, 0x54
    nr, arch, arg0, arg2 = 0, 4, 16, 32
    p: list[tuple[int, int, int, int]] = [
        (ld_abs, 0, 0, arch), (jeq, 1, 0, AUDIT_ARCH_X86_64), (ret, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        (ld_abs, 0, 0, nr),
    ]
    if unit_values(unit, "MemoryDenyWriteExecute") == ["yes"]:
        p += [(jeq, 0, 4, NR_MMAP), (ld_abs, 0, 0, arg2), (alu_and, 0, 0, 6), (jeq, 0, 1, 6),
              (ret, 0, 0, SECCOMP_RET_ERRNO | EPERM), (ld_abs, 0, 0, nr)]
        for number in (NR_MPROTECT, NR_PKEY_MPROTECT):
            p += [(jeq, 0, 3, number), (ld_abs, 0, 0, arg2), (jset, 0, 1, 4),
                  (ret, 0, 0, SECCOMP_RET_ERRNO | EPERM), (ld_abs, 0, 0, nr)]
    [families] = unit_values(unit, "RestrictAddressFamilies")
    allowed_families = [FAMILIES[f] for f in families.split()]
    p += [(jeq, 0, 2 * len(allowed_families) + 2, NR_SOCKET), (ld_abs, 0, 0, arg0)]
    for family in allowed_families:
        p += [(jeq, 0, 1, family), (ret, 0, 0, SECCOMP_RET_ALLOW)]
    p += [(ret, 0, 0, SECCOMP_RET_ERRNO | EAFNOSUPPORT), (ld_abs, 0, 0, nr)]
    numbers = syscall_numbers()
    for name in sorted(allowed_syscalls(unit)):
        if name in numbers:  # 32-bit-only names have no x86_64 number
            p += [(jeq, 0, 1, numbers[name]), (ret, 0, 0, SECCOMP_RET_ALLOW)]
    p += [(ret, 0, 0, SECCOMP_RET_ERRNO | EPERM)]
    assert len(p) < 4096
    return b"".join(struct.pack("=HBBI", *insn) for insn in p)


# Applied in a tiny wrapper that then execs the daemon (filters survive execve).
APPLY_SECCOMP = """
import ctypes, os, sys
prog = open(sys.argv[1], "rb").read()
libc = ctypes.CDLL(None, use_errno=True)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
buf = ctypes.create_string_buffer(prog, len(prog))
if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(Fprog(len(prog) // 8, ctypes.addressof(buf))), 0, 0):
    raise OSError(ctypes.get_errno(), "installing the seccomp filter")
os.execv(sys.argv[2], sys.argv[2:])
"""

READ_ONLY = ("/", "/sys", "/sys/kernel/tracing")


def sandboxed(unit: str, tmp_path: Path, argv: list[str], *, user: str | None = None) -> list[str]:
    caps = unit_values(unit, "CapabilityBoundingSet")[0].split()
    bounding = ",".join(["-all"] + ["+" + c.removeprefix("CAP_").lower() for c in caps])
    filter_path = tmp_path / f"{unit}.seccomp"
    filter_path.write_bytes(seccomp_program(unit))
    setpriv = ["setpriv", "--inh-caps=-all", f"--bounding-set={bounding}"]
    if user:
        setpriv += ["--reuid", user, "--regid", user, "--clear-groups"]
    remounts = " && ".join(f"mount -o remount,bind,ro {m}" for m in READ_ONLY)
    inner = " ".join(map(quote, [*setpriv, "--", sys.executable, "-c", APPLY_SECCOMP, str(filter_path),
                                 sys.executable, *argv]))
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", f"{remounts} && exec {inner}"]


def quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


SELF_CHECK = """
import ctypes, json, mmap, socket
out = {}
def attempt(name, fn):
    try:
        fn(); out[name] = "allowed"
    except OSError as exc:
        out[name] = exc.__class__.__name__ + ":" + str(exc.errno)
attempt("write_tmp", lambda: open("/tmp/azprobe-sandbox-probe", "w"))
attempt("wx_mmap", lambda: mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC))
attempt("af_packet", lambda: socket.socket(17, socket.SOCK_RAW))
attempt("af_inet", lambda: socket.socket().close())
libc = ctypes.CDLL(None, use_errno=True)
def mount():
    if libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")
attempt("mount", mount)
status = open("/proc/self/status").read()
out["cap_bnd"] = [l.split()[1] for l in status.splitlines() if l.startswith("CapBnd")][0]
print(json.dumps(out))
"""


@pytest.mark.parametrize(("unit", "user", "cap_bnd"), [
    ("azprobe-agent.service", None, "000000c000000000"),           # CAP_BPF | CAP_PERFMON
    ("azprobe-controller.service", "65534", "0000000000000000"),
])
def test_sandbox_bites(unit, user, cap_bnd, world_readable_dir):
    result = subprocess.run(sandboxed(unit, world_readable_dir, ["-c", SELF_CHECK], user=user), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["write_tmp"].endswith(":30") or seen["write_tmp"].endswith(":13")  # EROFS (or EACCES as nobody)
    assert seen["wx_mmap"] == "PermissionError:1"
    assert seen["af_packet"].endswith(":97")  # EAFNOSUPPORT, as RestrictAddressFamilies answers
    assert seen["af_inet"] == "allowed"
    assert seen["mount"] == "PermissionError:1"
    assert seen["cap_bnd"] == cap_bnd
    assert Path("/").stat() and os.access("/tmp", os.W_OK)  # the host stayed writable


@pytest.fixture
def world_readable_dir():
    """pytest's tmp_path sits under a 0700 root directory; the controller runs as nobody,
    like its DynamicUser, and must read its config and filter as /etc/azprobe allows."""
    path = Path(tempfile.mkdtemp(prefix="azprobe-sandbox-", dir="/dev/shm"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())


def writable_by(path: Path, uid: int) -> Path:
    """A directory the sandboxed daemon may write its --address-file to: on /dev/shm, which
    the sandbox leaves writable (it remounts only / and /sys read-only)."""
    out = path / "run"
    out.mkdir()
    os.chown(out, uid, uid)
    return out


@pytest.mark.kernel
def test_agent_runs_in_its_unit_sandbox(world_readable_dir):
    config = world_readable_dir / "agent.toml"
    config.write_text('[node]\nname = "sandboxed"\naz = "az-a"\n[agent]\nlisten = "127.0.0.1:0"\n'
                      'interval_s = 0.2\n[topology]\naz-a = ["127.0.0.0/8"]\n')
    address_file = writable_by(world_readable_dir, 0) / "agent.address"
    proc = subprocess.Popen(sandboxed("azprobe-agent.service", world_readable_dir,
                                      ["-m", "azprobe.commands.cli", "agent", "--config", str(config),
                                       "--address-file", str(address_file)]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        url = child_url(address_file, proc)
        wait_for(lambda: proc.poll() is not None or get_json(url + "/v1/windows?after=0")["windows"],
                 timeout=90, message="windows from the sandboxed agent")
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert get_json(url + "/v1/windows?after=0")["az"] == "az-a"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stderr.close()


def test_controller_runs_in_its_unit_sandbox(devconsul, world_readable_dir):
    with refused_port() as dead_agent_port:
        _controller_runs_in_its_unit_sandbox(devconsul, world_readable_dir, dead_agent_port)


def _controller_runs_in_its_unit_sandbox(devconsul, world_readable_dir: Path, dead_agent_port: int) -> None:
    config = world_readable_dir / "controller.toml"
    config.write_text(f'[controller]\nname = "sandboxed-ctl"\nlisten = "127.0.0.1:0"\nlock_delay_s = 0\n'
                      f'[consul]\naddress = "{devconsul.url}"\nprefix = "azprobe/sandbox/"\n'
                      f'[agents]\nstatic = ["http://127.0.0.1:{dead_agent_port}"]\n[topology]\nazs = ["az-a"]\n')
    address_file = writable_by(world_readable_dir, 65534) / "controller.address"
    proc = subprocess.Popen(sandboxed("azprobe-controller.service", world_readable_dir,
                                      ["-m", "azprobe.commands.cli", "controller", "--config", str(config),
                                       "--address-file", str(address_file)], user="65534"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        url = child_url(address_file, proc, timeout=30)
        # Leader means it held a Consul session and wrote the lock: HTTP out, HTTP in.
        wait_for(lambda: proc.poll() is not None or get_json(f"{url}/healthz").get("leader"),
                 timeout=30, message="the sandboxed controller to lead")
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stderr.close()
