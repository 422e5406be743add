#!/usr/bin/env python3
"""Does the Kafka broker on 127.0.0.1:PORT answer a real request?

Sends one Metadata request (API key 3, version 0, all topics) and parses the answer: the
correlation id must match and at least one broker must be listed. A broker whose process
lives but whose storage died (tansu's storage task panicked) fails this, while a TCP connect
alone still succeeds. Exit 0 and print `N brokers, M topics` when it answers, else exit 1
with the reason on stderr. Stdlib only.

    kafka_probe.py PORT [TIMEOUT_SECONDS]
"""
import socket
import struct
import sys


def read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def probe(port, timeout):
    client = b"weft-stack-probe"
    correlation = 0x5EF7
    # RequestHeader v1: api_key, api_version, correlation_id, client_id; body: topics [] (all).
    body = struct.pack(">hhih", 3, 0, correlation, len(client)) + client + struct.pack(">i", 0)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", read_exact(s, 4))
        if size < 8 or size > 64 << 20:
            raise ValueError("implausible response size %d" % size)
        data = read_exact(s, size)
    (got,) = struct.unpack_from(">i", data, 0)
    if got != correlation:
        raise ValueError("correlation id %d, expected %d" % (got, correlation))
    (brokers,) = struct.unpack_from(">i", data, 4)
    if brokers < 1:
        raise ValueError("metadata lists no broker")
    off = 8
    for _ in range(brokers):
        off += 4
        (hlen,) = struct.unpack_from(">h", data, off)
        off += 2 + hlen + 4
    (topics,) = struct.unpack_from(">i", data, off)
    return brokers, topics


def main():
    port = int(sys.argv[1])
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    try:
        brokers, topics = probe(port, timeout)
    except Exception as e:  # any failure means "not answering"; say which
        print("kafka on 127.0.0.1:%d does not answer a metadata request: %s" % (port, e), file=sys.stderr)
        return 1
    print("%d brokers, %d topics" % (brokers, topics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
