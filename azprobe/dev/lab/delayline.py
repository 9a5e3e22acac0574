"""The delay line: holds each packet of one NFQUEUE for a fixed time, then accepts it.

There is no tc netem on these machines, so delay is a userspace verdict: nftables hands
packets toward an AZ to queue N (`queue num N bypass`), this process keeps each verdict
for `--delay-ms` and releases packets in arrival order. Only metadata is copied from the
kernel (COPY_META), and the fixed delay keeps FIFO order equal to release order.

Run inside the router namespace (NFQUEUE numbers are per namespace):
    ip netns exec azp-router python -m azprobe.dev.lab.delayline --queue 101 --delay-ms 50
Prints "ready" on stdout once bound, then nothing more on stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import select
import signal
import sys
import time

MAX_QUEUE_LEN = 16384  # 10k pkt/s x 1 s of delay, with headroom


def _prefer_realtime() -> None:
    # Release times are only as good as our wake-ups: on a busy 2-core box a normal-priority
    # process wakes milliseconds late. The loop sleeps in select(), so a real-time priority
    # costs the box nothing while idle. Without the privilege, run as we are.
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (OSError, AttributeError):
        try:
            os.nice(-10)
        except OSError:
            pass


class Lateness:
    """How late packets leave versus their due time: the delay line's own accuracy."""

    def __init__(self, keep: int = 10_000) -> None:
        self.packets = 0
        self.recent: collections.deque[float] = collections.deque(maxlen=keep)

    def record(self, late_s: float) -> None:
        self.packets += 1
        self.recent.append(late_s * 1e6)

    def to_json(self) -> dict[str, float | int]:
        ordered = sorted(self.recent)

        def q(f: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(f * len(ordered)))], 1) if ordered else 0.0
        return {"packets": self.packets, "late_us_p50": q(0.5), "late_us_p99": q(0.99),
                "late_us_max": round(ordered[-1], 1) if ordered else 0.0}


def _write_stats(path: str | None, lateness: Lateness) -> None:
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(lateness.to_json(), fh)
        os.replace(tmp, path)


def run(queue: int, delay_s: float, stats_file: str | None = None) -> None:
    from netfilterqueue import COPY_META, NetfilterQueue

    _prefer_realtime()
    held: collections.deque = collections.deque()

    def on_packet(pkt) -> None:  # type: ignore[no-untyped-def]
        held.append((time.monotonic() + delay_s, pkt))

    nfq = NetfilterQueue()
    nfq.bind(queue, on_packet, max_len=MAX_QUEUE_LEN, mode=COPY_META)
    fd = nfq.get_fd()
    stopping = False
    lateness = Lateness()
    next_stats = time.monotonic()

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    # Nothing else goes to stdout: the parent stopped reading it.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        while not stopping:
            now = time.monotonic()
            while held and held[0][0] <= now:
                due, pkt = held.popleft()
                pkt.accept()
                lateness.record(now - due)
            if now >= next_stats:
                _write_stats(stats_file, lateness)
                next_stats = now + 1.0
            timeout = max(0.0, held[0][0] - now) if held else 0.2
            try:
                readable, _, _ = select.select([fd], [], [], timeout)
            except InterruptedError:
                continue
            if readable:
                nfq.run(block=False)
    finally:
        # Let held packets through instead of dropping them on the way out.
        while held:
            held.popleft()[1].accept()
        nfq.unbind()
        _write_stats(stats_file, lateness)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="azprobe.dev.lab.delayline", description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, required=True, help="NFQUEUE number")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay added to every packet")
    parser.add_argument("--stats-file", help="JSON with release lateness, rewritten every second")
    args = parser.parse_args(argv)
    if not 0 < args.delay_ms <= 10_000:
        parser.error("--delay-ms must be in (0, 10000]")
    run(args.queue, args.delay_ms / 1000.0, args.stats_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
