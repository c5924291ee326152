"""Two threads on one TCPStore: one loops ``compare_set`` and ``get`` through the launcher's
PaddedStore while the main thread builds ordinary Python objects.

On torch < 2.4, ``compare_set``'s result was allocated without the GIL; with short values this
loop crashed the interpreter (SIGSEGV) on every run on torch 2.1.2. Prints "ok" and the number of
store calls made.
"""

import json
import sys
import threading
from datetime import timedelta

import torch.distributed as dist

from npu_migrate.launch.nodes.values import PaddedStore

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
writer = PaddedStore(dist.TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=30)))
reader = PaddedStore(dist.TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=30)))
writer.set("state", "v")
stop = threading.Event()
calls = [0]


def hammer() -> None:
    while not stop.is_set():
        assert reader.compare_set("state", "x", "y") == b"v"  # a failed swap returns the value
        assert reader.compare_set("absent", "\0absent", "\0absent") == b"\0absent"
        assert reader.get("state") == b"v"
        calls[0] += 3


thread = threading.Thread(target=hammer, daemon=True)
thread.start()
for i in range(ROUNDS):
    json.loads(json.dumps({"i": i, "items": list(range(5)), "name": str(i)}))
stop.set()
thread.join()
print("ok", calls[0])
