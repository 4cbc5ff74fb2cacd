"""A KV-event consumer for benchmarks: binds a SUB socket, decodes and counts every batch.

Run as `python bench/kv_subscriber.py`; it binds a free loopback port and prints `ready
ENDPOINT` (the endpoint the engine is to connect to), then counts until stdin closes, and
prints one JSON line: batches, events, stored blocks, sequence gaps, and the wall times
(time.time()) of the first and last batch received.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import msgspec
import zmq


def main() -> int:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 100)
    sub.bind("tcp://127.0.0.1:*")  # the engine connects (llm-d's layout); the system picks the port
    endpoint = sub.getsockopt_string(zmq.LAST_ENDPOINT)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print(f"ready {endpoint}", flush=True)
    decode = msgspec.msgpack.decode
    counts = {"batches": 0, "events": 0, "stored_blocks": 0, "removed_blocks": 0, "gaps": 0}
    first = last = None
    first_at = last_at = 0.0
    while not done.is_set():
        try:
            _, seq_frame, payload = sub.recv_multipart()
        except zmq.Again:
            continue
        seq = int.from_bytes(seq_frame, "big")
        if last is not None and seq != last + 1:
            counts["gaps"] += 1
        last_at = time.time()
        if first is None:
            first, first_at = seq, last_at
        last = seq
        _, events, _ = decode(payload)
        counts["batches"] += 1
        counts["events"] += len(events)
        for event in events:
            kind = event["type"]
            if kind == "BlockStored":
                counts["stored_blocks"] += len(event["block_hashes"])
            elif kind == "BlockRemoved":
                counts["removed_blocks"] += len(event["block_hashes"])
    span = {"first_seq": first, "last_seq": last, "first_at": first_at, "last_at": last_at}
    print(json.dumps({**counts, **span}), flush=True)
    sub.close(linger=0)
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
