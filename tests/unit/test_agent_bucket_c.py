"""The BPF bucket arithmetic (bpf/azprobe.bpf.h) compiled natively must equal sketch.bucket_index,
and the host RTT bucket it derives from a sketch index must equal window.host_rtt_bucket."""

import random
import shutil
import subprocess

import pytest

from azprobe import bpf
from azprobe.contracts.sketch import MAX_VALUE_BITS, NUM_BUCKETS, bucket_index
from azprobe.contracts.window import HOST_RTT_FIRST_US, host_rtt_bucket
from tests.helpers import require

PROGRAM = r"""
#include <stdio.h>
#include <stdint.h>
typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;
#include "azprobe.bpf.h"
int main(void) {
    unsigned long long v;
    while (scanf("%llu", &v) == 1) printf("%u %u\n", azp_bucket_index(v), azp_host_rtt_bucket(azp_bucket_index(v)));
    return 0;
}
"""


@pytest.fixture(scope="module")
def bucket_binary(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    require(cc is not None, "no C compiler (cc, gcc or clang)", "apt-get install gcc")
    d = tmp_path_factory.mktemp("bucket")
    (d / "main.c").write_text(PROGRAM)
    subprocess.run([cc, "-O2", f"-I{bpf.source_dir()}", "-o", str(d / "bucket"), str(d / "main.c")], check=True)
    return d / "bucket"


def test_c_bucket_index_equals_python(bucket_binary):
    rng = random.Random(7)
    values = list(range(0, 4096)) + [(1 << b) + d for b in range(4, 40) for d in (-1, 0, 1)]
    values += [rng.randrange(0, 1 << 40) for _ in range(5000)] + [2**64 - 1]
    values = [v for v in values if v >= 0]
    got = _run(bucket_binary, values)
    assert [index for index, _ in got] == [bucket_index(v) for v in values]
    assert max(index for index, _ in got) == bucket_index((1 << MAX_VALUE_BITS) - 1) < NUM_BUCKETS


def _run(binary, values: list[int]) -> list[tuple[int, int]]:
    out = subprocess.run([str(binary)], input="\n".join(map(str, values)) + "\n",
                         capture_output=True, text=True, check=True).stdout.split()
    return [(int(out[i]), int(out[i + 1])) for i in range(0, len(out), 2)]


def test_c_host_rtt_bucket_equals_python(bucket_binary):
    # Every bucket edge (256 µs x 4^i) and its neighbours, and values far beyond the last.
    edges = [HOST_RTT_FIRST_US * 4**i + d for i in range(9) for d in (-1, 0, 1)]
    values = list(range(0, 300)) + edges + [random.Random(3).randrange(0, 1 << 36) for _ in range(3000)]
    values.append(2**64 - 1)
    got = _run(bucket_binary, values)
    # Values above the sketch's range saturate at its last bucket, as the sketch does.
    assert [host for _, host in got] == [host_rtt_bucket(min(v, (1 << MAX_VALUE_BITS) - 1)) for v in values]
    assert {host for _, host in got} == set(range(8))


def test_header_constants_match_sketch():
    assert bpf.constant("NUM_BUCKETS") == NUM_BUCKETS
    assert bpf.constant("MAX_VALUE_BITS") == MAX_VALUE_BITS
    assert bpf.constant("MAX_PATHS") == bpf.constant("MAX_AZ") ** 2
    assert 2 ** bpf.constant("HOST_RTT_FIRST_OCTAVE") == HOST_RTT_FIRST_US
