"""The launcher's blocking waits on a real TCPStore: torch's synchronize and barrier on the running torch, arrivals.

Every value goes through the launcher's wrappers (padded, and signed with a secret), as on the
board; each party of an exchange runs in a thread with a client of its own, as each launcher has.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from conftest import free_port
from npu_migrate.launch.nodes.store import arrive, arrived, barrier, peek, synchronize, wait_keys
from npu_migrate.launch.nodes import values
from npu_migrate.launch.nodes.values import PaddedStore, pad

SECRET = b"s" * 32


@pytest.fixture
def server():
    yield TCPStore("127.0.0.1", free_port(), None, True, timedelta(seconds=30), wait_for_workers=False)


def _client(server: TCPStore, secret: bytes | None, seconds: float = 30) -> object:
    return values.wrap(TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=seconds)), secret)


def _in_threads(fn, n: int) -> list:
    results: list = [None] * n
    errors: list = []

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


@pytest.mark.parametrize("secret", [None, SECRET], ids=["plain", "signed"])
def test_synchronize_gives_every_party_every_value_unpadded(server, secret) -> None:
    got = _in_threads(lambda i: synchronize(_client(server, secret), f"node{i}".encode(), i, 3,
                                                      "job/round/r/member/", 30), 3)
    assert got == [[b"node0", b"node1", b"node2"]] * 3


def test_synchronize_times_out_when_a_party_never_comes(server) -> None:
    with pytest.raises(Exception):  # noqa: B017 - torch's store error, whose class differs between versions
        synchronize(_client(server, None), b"alone", 0, 2, "job/round/r/member/", 0.5)


def test_barrier_on_this_torch(server) -> None:
    assert _in_threads(lambda i: barrier(_client(server, None), i, 2, "job/barrier", 30), 2) == [None, None]


@pytest.mark.parametrize("secret", [None, SECRET], ids=["plain", "signed"])
def test_the_nth_arrival_sets_its_key_and_a_waiter_sees_it(server, secret) -> None:
    store = _client(server, secret)
    assert not wait_keys(_client(server, secret), ["job/done/0/2"], 0.2, check=store)
    assert [arrive(_client(server, secret), "job/done/0") for _ in range(2)] == [1, 2]
    assert wait_keys(_client(server, secret), ["job/done/0/2"], 5, check=store)
    assert arrived(store, "job/done/0", 2) and not arrived(store, "job/done/0", 3)


def test_a_waiter_blocks_until_the_last_arrival(server) -> None:
    seen = threading.Event()
    waiter = threading.Thread(target=lambda: wait_keys(_client(server, None), ["job/acked/0/2"], 30)
                              and seen.set())
    waiter.start()
    arrive(_client(server, None), "job/acked/0")
    assert not seen.is_set()  # job/acked/0/2 does not exist yet
    arrive(_client(server, None), "job/acked/0")
    waiter.join(30)
    assert seen.is_set()


def test_a_forged_arrival_key_ends_a_wait_but_not_the_signed_count(server) -> None:
    # A process without the secret can set the key a waiter blocks on (a wait sees keys, not values);
    # the signed count, which the board confirms with, does not move.
    store = _client(server, SECRET)
    arrive(store, "job/done/0")
    PaddedStore(TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=30))).set("job/done/0/2", "1")
    assert wait_keys(_client(server, SECRET), ["job/done/0/2"], 5, check=store)
    assert not arrived(store, "job/done/0", 2)
    assert peek(store, "job/done/0/2") is None  # its value reads as absent


def test_multi_get_through_the_wrappers_unpads_and_checks() -> None:
    port = free_port()
    server = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False)
    signed = _client(server, SECRET)
    signed.set("a", "one")
    signed.set("b", "two")
    assert signed.multi_get(["a", "b"]) == [b"one", b"two"]
    raw = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
    assert PaddedStore(raw).multi_get(["a"])[0].startswith(b"~npu_migrate-hmac1:")
    raw.set("c", pad("forged"))
    with pytest.raises(values.UnauthenticatedValue):
        signed.multi_get(["a", "c"])


def test_a_call_left_blocked_neither_hides_errors_nor_holds_the_exit() -> None:
    """run_interruptibly and JobStore.quietly run the call in a daemon thread behind a Future: its
    TimeoutError is re-raised as itself (not taken for a wait that timed out), and a call still
    blocked when the launcher gives up on it does not keep the process from exiting, as a
    ThreadPoolExecutor's worker would."""
    import subprocess
    import sys

    script = """
import threading
from npu_migrate.launch.signals import Signals, in_daemon_thread, run_interruptibly

def late():
    raise TimeoutError("the call's own")

try:
    run_interruptibly(late, Signals(), "t")
except TimeoutError as exc:
    print("raised:", exc)

class GaveUp(Exception):
    pass

def give_up():
    raise GaveUp()

blocked = threading.Event()
try:
    run_interruptibly(blocked.wait, Signals(), "blocked", also=give_up)
except GaveUp:
    print("gave up")
in_daemon_thread(blocked.wait, "blocked")
print("exiting")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["raised: the call's own", "gave up", "exiting"], done.stdout


@pytest.mark.parametrize("secret", [None, SECRET])
def test_a_wait_that_another_clients_peek_ends_early_waits_for_the_key(server, secret) -> None:
    """torch's libuv store (the default from torch 2.4) ends a wait when another client peeks at the
    missing key (a compare-and-set that sets nothing): the wait reads the keys again and waits on."""
    reader, peeker = _client(server, secret), _client(server, secret)
    was_set = threading.Event()
    ended: list = []

    def waiter(_: int) -> None:
        found = wait_keys(_client(server, secret), ["npu_migrate/j/members"], 60, check=reader)
        ended.append((found, was_set.is_set(), reader.get("npu_migrate/j/members")))

    thread = threading.Thread(target=waiter, args=(0,))
    thread.start()
    for _ in range(300):  # every node's present() check while this one waits
        assert peek(peeker, "npu_migrate/j/members") is None
    was_set.set()
    peeker.set("npu_migrate/j/members", '["node 0", "node 1"]')
    thread.join(60)
    assert ended == [(True, True, b'["node 0", "node 1"]')]
