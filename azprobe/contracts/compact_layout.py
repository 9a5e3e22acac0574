"""The compact /v1/windows encoding's layout: msgspec structs whose field types and
constraints msgspec checks in C as it decodes (windowcodec.py builds the windows from them).

Compact layout (msgpack, every struct an array in this field order):

    page   = [node, az, boot_id, [window, ...]]
    window = [schema, node, az, boot_id, seq, start, end, cpu, mem, lost_events, [path, ...], source,
              [host, ...], hosts_dropped]      (the last three optional, trailing)
    path   = [src, dst, conn_attempts, conn_ok, conn_refused, conn_timeout, syn_retrans,
              retrans, rto, rtt_us, connect_us]
    hist   = {lower bound µs: count, ...}   loglin-16 lower bounds, counts > 0
    host   = [src, dst, addr, connects, failures, retrans, rto, [rtt bucket count x 8]]
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from azprobe.contracts.sketch import NUM_BUCKETS
from azprobe.contracts.window import (
    DEFAULT_SOURCE,
    HOST_RTT_BUCKETS,
    MAX_ADDRESS_LEN,
    MAX_AZ_NAME,
    MAX_BOOT_ID,
    MAX_BUCKET_LOWER,
    MAX_COUNT,
    MAX_HOSTS,
    MAX_NODE_NAME,
    MAX_SEQ,
    MAX_SOURCE_LEN,
)

# The window contract's per-field rules, checked by msgspec in C (window.py has the same
# rules for JSON); the cross-field ones are window.check_window's. The names' characters
# are window.is_name's, in windowcodec._window_from_struct: every window repeats the same
# few names, and that check remembers them, where a pattern here ran a regex on each.
AzName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_AZ_NAME)]
NodeName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NODE_NAME)]
BootId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_BOOT_ID)]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
LowerBound = Annotated[int, msgspec.Meta(ge=0, le=MAX_BUCKET_LOWER)]
Buckets = Annotated[dict[LowerBound, Count], msgspec.Meta(max_length=NUM_BUCKETS)]
Time = Annotated[float, msgspec.Meta(ge=0, le=1e11)]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Source = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SOURCE_LEN, pattern="^[A-Za-z0-9]+$")]
# The address's characters here; its canonical form is window.check_window's, for both encodings.
Address = Annotated[str, msgspec.Meta(min_length=2, max_length=MAX_ADDRESS_LEN, pattern="^[0-9a-f:.]+$")]
RttBuckets = Annotated[list[Count], msgspec.Meta(min_length=HOST_RTT_BUCKETS, max_length=HOST_RTT_BUCKETS)]


class CompactHost(msgspec.Struct, array_like=True):
    src: AzName
    dst: AzName
    addr: Address
    connects: Count
    failures: Count
    retrans: Count
    rto: Count
    rtt_buckets: RttBuckets


Hosts = Annotated[list[CompactHost], msgspec.Meta(max_length=MAX_HOSTS)]


class CompactPath(msgspec.Struct, array_like=True):
    src: AzName
    dst: AzName
    conn_attempts: Count
    conn_ok: Count
    conn_refused: Count
    conn_timeout: Count
    syn_retrans: Count
    retrans: Count
    rto: Count
    rtt_us: Buckets
    connect_us: Buckets


class CompactWindow(msgspec.Struct, array_like=True):
    schema: int
    node: NodeName
    az: AzName
    boot_id: BootId
    seq: Seq
    start: Time
    end: Time
    cpu: Fraction
    mem: Fraction
    lost_events: Count
    paths: list[CompactPath]
    source: Source = DEFAULT_SOURCE  # trailing and optional: an older agent's windows omit it
    hosts: Hosts = []  # trailing and optional, as source
    hosts_dropped: Count = 0


class CompactWindowHead(msgspec.Struct, array_like=True):
    """The leading fields of a window, untyped: decoding stops short of the paths."""

    schema: object = None
    node: object = None
    az: object = None
    boot_id: object = None
    seq: object = None
    start: object = None
    end: object = None


class CompactPage(msgspec.Struct, array_like=True):
    node: str  # the header's names: _page checks them, for both encodings
    az: str
    boot_id: str
    windows: list[msgspec.Raw]


class CompactTypedPage(msgspec.Struct, array_like=True):
    """A page whose every window is valid by type: one decode, and no value is skipped
    untyped (msgspec skips recursively, so only a depth-checked body may be skipped)."""

    node: str
    az: str
    boot_id: str
    windows: list[CompactWindow]


PAGE_DECODER = msgspec.msgpack.Decoder(CompactPage)
TYPED_PAGE_DECODER = msgspec.msgpack.Decoder(CompactTypedPage)
WINDOW_DECODER = msgspec.msgpack.Decoder(CompactWindow)
HEAD_DECODER = msgspec.msgpack.Decoder(CompactWindowHead)
ENCODER = msgspec.msgpack.Encoder()
