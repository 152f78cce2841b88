"""Measures what one TCP stream carries over 127.0.0.1: a child process
sends --mib MiB, this one reads them and prints the rate in MB/s (10^6
bytes per second) as ``loopback_rate_mbps <value>``. scripts/shaped_loopback.sh
checks with it that a tbf qdisc on lo holds before a benchmark relies on it.
With --expect-mbps, exits 4 unless the rate is within [--low, --high] of it."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import sys
import time

CHUNK = 1 << 20


def _send(port: int, total: int) -> None:
    buf = b"\0" * CHUNK
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        left = total
        while left:
            left -= s.send(buf[: min(left, CHUNK)])
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # the reader's end: the rate counts every byte read


def measure(mib: int) -> float:
    total = mib << 20
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        srv.settimeout(60)
        child = mp.get_context("spawn").Process(target=_send, args=(srv.getsockname()[1], total))
        child.start()
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(60)
            got, t0 = 0, time.perf_counter()
            while got < total:
                n = len(conn.recv(CHUNK))
                if not n:
                    raise RuntimeError(f"the sender stopped after {got} of {total} bytes")
                got += n
            seconds = time.perf_counter() - t0
            conn.sendall(b"x")
        child.join(60)
    return total / seconds / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB to send (default 256)")
    ap.add_argument("--expect-mbps", type=float, help="the rate the shaping should give")
    ap.add_argument("--low", type=float, default=0.7, help="lowest fraction of it accepted (0.7)")
    ap.add_argument("--high", type=float, default=1.1, help="highest fraction of it accepted (1.1)")
    args = ap.parse_args()
    rate = measure(args.mib)
    print(f"loopback_rate_mbps {rate:.0f}", flush=True)
    if args.expect_mbps and not args.low * args.expect_mbps <= rate <= args.high * args.expect_mbps:
        print(f"loopback_rate: {rate:.0f} MB/s is not within [{args.low}, {args.high}] x "
              f"{args.expect_mbps:.0f} MB/s: the shaping does not hold", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
