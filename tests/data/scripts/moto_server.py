"""An S3 server in its own process, for tests that must stop it abruptly (SIGKILL) mid-transfer.

Starts moto's ThreadedMotoServer on 127.0.0.1 (a free port), prints ``PORT <n>`` on stdout, and
serves until it is killed or its stdin closes.
"""

from __future__ import annotations

import logging
import sys

from moto.server import ThreadedMotoServer

if __name__ == "__main__":
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(f"PORT {server.get_host_and_port()[1]}", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    server.stop()
