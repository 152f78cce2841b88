"""Measure one TCP transfer between two emulated hosts (no iperf needed).

    tcp_rate.py recv ADDR PORT MBYTES   # prints "rate <MB/s> MB/s"
    tcp_rate.py send ADDR PORT MBYTES   # retries until the receiver listens
"""

import socket
import sys
import time

mode, addr, port, mbytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
total = mbytes * 1000 * 1000

if mode == "recv":
    srv = socket.create_server((addr, port))
    conn, _ = srv.accept()
    got, start = 0, None
    while got < total:
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        if start is None:  # time from the first byte: connection setup is not bandwidth
            start = time.monotonic()
        got += len(chunk)
    elapsed = time.monotonic() - start
    conn.sendall(b"k")  # the sender closes only once everything arrived
    assert got == total, f"received {got} of {total} bytes"
    print(f"rate {got / elapsed / 1e6:.1f} MB/s", flush=True)
else:
    deadline = time.monotonic() + 20
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    sock.settimeout(60)
    sock.sendall(b"x" * total)
    sock.recv(1)
    print(f"sent {total} bytes", flush=True)
