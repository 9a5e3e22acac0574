"""The lab's gRPC pieces, run inside namespaces (python -m azprobe.dev.lab.grpcapp):

    server --az AZ [--port 50051]       a grpcio server answering /azprobe.lab.Echo/Call
                                        with its AZ's name (no .proto: raw bytes)
    load --target xds:///backend --rate R --out FILE
                                        a proxyless grpcio client: the channel resolves
                                        the target through the xDS bootstrap in
                                        GRPC_XDS_BOOTSTRAP_CONFIG (its node names its
                                        zone); open-loop calls, one CSV line per call:
                                        send time (monotonic s), latency ms, status, AZ

The CSV is the HTTP load client's (azprobe.dev.lab.http), status 200 for OK, 0 for a
deadline, -1 for any other error, so the drill scores both doors the same way
(azprobe.dev.drill.metrics). Prints "ready" once serving / once the first call succeeded.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

GRPC_PORT = 50051
METHOD = "/azprobe.lab.Echo/Call"
OK, TIMEOUT, ERROR = 200, 0, -1


def _identity(b: bytes) -> bytes:
    return b


def serve(port: int, az: str) -> None:
    from concurrent import futures

    import grpc

    answer = az.encode()
    handler = grpc.method_handlers_generic_handler("azprobe.lab.Echo", {
        "Call": grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer, request_deserializer=_identity,
                                                    response_serializer=_identity)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=[handler])
    server.add_insecure_port(f"0.0.0.0:{port}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    server.stop(0.5)


def load(target: str, rate: float, timeout_s: float, out: Path, ready_timeout_s: float) -> None:
    import grpc

    channel = grpc.insecure_channel(target)
    call = channel.unary_unary(METHOD, request_serializer=_identity, response_deserializer=_identity)
    deadline = time.monotonic() + ready_timeout_s
    while True:  # the xDS resolution and the first connection
        try:
            call(b"", timeout=1.0, wait_for_ready=True)
            break
        except grpc.RpcError as exc:
            if time.monotonic() > deadline:
                sys.exit(f"no successful call to {target} within {ready_timeout_s:g} s: {exc.code()} {exc.details()}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lock = threading.Lock()
    records: list[str] = []

    def done(sent: float, future: grpc.Future) -> None:
        latency = (time.monotonic() - sent) * 1000
        try:
            az, status = future.result().decode("ascii", "replace")[:32], OK
        except grpc.RpcError as exc:
            az, status = "-", TIMEOUT if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else ERROR
        with lock:
            records.append(f"{sent:.6f},{latency:.3f},{status},{az}\n")

    def flush() -> None:
        with lock:
            chunk, records[:] = list(records), []
        if chunk:
            with open(out, "a") as fh:
                fh.writelines(chunk)

    print("ready", flush=True)
    period, next_at, last_flush = 1.0 / rate, time.monotonic(), time.monotonic()
    while not stop.is_set():
        sent = time.monotonic()
        future = call.future(b"", timeout=timeout_s)
        future.add_done_callback(lambda f, sent=sent: done(sent, f))
        if sent - last_flush >= 0.5:
            flush()
            last_flush = sent
        next_at += period
        stop.wait(max(0.0, next_at - time.monotonic()))
    time.sleep(min(timeout_s, 1.0))  # let the calls in flight finish or time out
    flush()
    channel.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="azprobe.dev.lab.grpcapp")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, default=GRPC_PORT)
    s.add_argument("--az", required=True)
    c = sub.add_parser("load")
    c.add_argument("--target", required=True)
    c.add_argument("--rate", type=float, default=100.0)
    c.add_argument("--timeout-s", type=float, default=1.0)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--ready-timeout-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.role == "server":
        serve(args.port, args.az)
    else:
        if not 0.1 <= args.rate <= 2000:
            parser.error(f"--rate {args.rate} is outside 0.1..2000")
        load(args.target, args.rate, args.timeout_s, args.out, args.ready_timeout_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
