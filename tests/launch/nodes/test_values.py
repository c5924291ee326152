"""The launcher's PaddedStore on a real TCPStore: what the launcher and torch's rendezvous backend
read back, and compare_set beside another thread (torch < 2.4 built its result without the GIL)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from conftest import LAUNCH_SCRIPTS, child_env
from npu_migrate.launch.nodes.values import PaddedStore, pad, unpad


@pytest.fixture()
def store():
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False)
    yield PaddedStore(server)


def test_values_read_back_as_written(store: PaddedStore) -> None:
    store.set("job", "token-1")
    assert store.get("job") == b"token-1"
    long = "x" * 5000 + "é"
    store.set("long", long)
    assert store.get("long").decode() == long
    assert len(store.raw.get("job")) > 512  # on the wire: past CPython's small-object allocator


def test_compare_set_keeps_its_meaning(store: PaddedStore) -> None:
    assert store.compare_set("claim", "", "mine") == b"mine"  # absent and expected "": set
    assert store.compare_set("claim", "", "theirs") == b"mine"  # present: the current value
    assert store.compare_set("claim", "mine", "next") == b"next"  # swapped
    assert store.compare_set("claim", "stale", "other") == b"next"
    assert store.compare_set("missing", "\0absent", "\0absent") == b"\0absent"  # a peek: expected back


def test_counters_and_other_calls_pass_through(store: PaddedStore) -> None:
    assert store.add("done", 1) == 1 and store.add("done", 0) == 1
    store.set_timeout(timedelta(seconds=5))
    assert unpad(b"12") == b"12" and pad("") == b"" and unpad(pad("a")) == b"a"


def test_torch_rendezvous_backend_keeps_its_state(store: PaddedStore) -> None:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    backend = C10dRendezvousBackend(store, "job")
    assert backend.get_state() is None
    state, token, ok = backend.set_state(b"round 0")
    assert (state, ok) == (b"round 0", True)
    state, token2, ok = backend.set_state(b"round 1", token)
    assert (state, ok) == (b"round 1", True)
    state, _, ok = backend.set_state(b"round 2", token)  # a stale token loses
    assert (state, ok) == (b"round 1", False)
    assert backend.get_state() == (b"round 1", token2)


@pytest.mark.slow
def test_compare_set_beside_another_thread_does_not_crash() -> None:
    result = subprocess.run([sys.executable, str(LAUNCH_SCRIPTS / "store_threads.py")], env=child_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    assert result.stdout.startswith("ok ")
