"""What a round trip costs on loopback before any env work: the floor under bench_remote.py.

A server process answers each message with a reply the size of a 64-env CartPole step reply
(2,770 bytes for a 600-byte request), three ways: a plain socket pair (the OS's floor), a
grpcio bidirectional stream with the sync API (what `shoal serve-env` and RemoteVectorEnv use),
the same stream served by grpc.aio, and one unary call per message (what the stream replaced).
Then each with the server burning 430 us of Python per message (the in-process step of 64
CartPole envs on the Intel machine), to show the cost adds.

    .venv/bin/python benchmarks/bench_grpc_floor.py
"""

from __future__ import annotations

import asyncio
import queue
import socket
import subprocess
import sys
import time
from concurrent import futures

import grpc
import numpy as np

from common import machine, save

REQUEST, REPLY = b"a" * 600, b"x" * 2770
N = 3000


def burn(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def serve(kind: str, burn_us: float) -> None:
    """Run a server of ``kind`` in this process; print its port."""
    if kind == "socket":
        listener = socket.create_server(("127.0.0.1", 0))
        print(listener.getsockname()[1], flush=True)
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            got = 0
            while got < len(REQUEST):
                chunk = conn.recv(65536)
                if not chunk:
                    return
                got += len(chunk)
            burn(burn_us)
            conn.sendall(REPLY)
    if kind in ("sync", "unary"):
        def stream(requests, context):
            for _ in requests:
                burn(burn_us)
                yield REPLY

        def unary(request, context):
            burn(burn_us)
            return REPLY
        server = grpc.server(futures.ThreadPoolExecutor(4))
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "Echo", {"S": grpc.stream_stream_rpc_method_handler(stream),
                     "U": grpc.unary_unary_rpc_method_handler(unary)})])
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        server.start()
        server.wait_for_termination()

    async def main() -> None:
        async def stream(requests, context):
            async for _ in requests:
                burn(burn_us)
                yield REPLY
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "Echo", {"S": grpc.stream_stream_rpc_method_handler(stream)})])
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        await server.start()
        await server.wait_for_termination()
    asyncio.run(main())


def round_trips(kind: str, port: int) -> np.ndarray:
    """Seconds per round trip, N of them after a warm-up."""
    lat = []
    if kind == "socket":
        conn = socket.create_connection(("127.0.0.1", port))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def one() -> None:
            conn.sendall(REQUEST)
            got = 0
            while got < len(REPLY):
                got += len(conn.recv(65536))
    elif kind == "unary":
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        call = channel.unary_unary("/Echo/U")

        def one() -> None:
            call(REQUEST, timeout=10)
    else:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        requests: queue.SimpleQueue = queue.SimpleQueue()
        replies = channel.stream_stream("/Echo/S")(iter(requests.get, None))

        def one() -> None:
            requests.put(REQUEST)
            next(replies)
    for i in range(N + 200):
        t = time.perf_counter()
        one()
        if i >= 200:
            lat.append(time.perf_counter() - t)
    if kind in ("sync", "aio"):
        requests.put(None)
    if kind != "socket":
        channel.close()
    return np.array(lat)


def main() -> None:
    print(f"machine: {machine()}")
    result = {}
    for kind, burn_us in (("socket", 0), ("sync", 0), ("aio", 0), ("unary", 0),
                          ("socket", 430), ("sync", 430), ("aio", 430), ("unary", 430)):
        proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(burn_us)], stdout=subprocess.PIPE,
                                text=True)
        try:
            lat = round_trips(kind, int(proc.stdout.readline()))
        finally:
            proc.kill()
            proc.wait()
        p50, p99 = np.percentile(lat, 50) * 1e6, np.percentile(lat, 99) * 1e6
        label = {"socket": "TCP socket", "sync": "grpcio stream, sync server", "aio": "grpcio stream, aio server",
                 "unary": "grpcio unary, sync server"}[kind]
        print(f"{label:28s} server work {burn_us:3d} us: round trip p50 {p50:6.0f} us, p99 {p99:6.0f} us")
        result[f"{kind}_{burn_us}"] = {"p50_us": p50, "p99_us": p99}
    grpc_cost = result["sync_0"]["p50_us"] - result["socket_0"]["p50_us"]
    print(f"grpcio's own cost per round trip (sync stream - socket, p50): {grpc_cost:.0f} us")
    save("grpc_floor", result)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], float(sys.argv[3]))
    else:
        main()
