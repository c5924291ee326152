"""The signed store on its own: what a reader gets when a process without the secret wrote the value."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from npu_migrate.launch.nodes.values import AuthStore, PaddedStore, UnauthenticatedValue, pad, sign, verify

SECRET = b"k" * 32


@pytest.fixture
def stores():
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False)
    lines: list[str] = []
    signed = AuthStore(PaddedStore(dist.TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=10))),
                       SECRET, notify=lines.append)
    plain = dist.TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=10))  # the attacker
    yield signed, plain, lines
    del signed, plain, server


def test_a_value_is_good_only_under_its_key_and_secret() -> None:
    raw = sign(SECRET, "a", "value")
    assert verify(SECRET, "a", raw) == b"value"
    assert verify(SECRET, "b", raw) is None
    assert verify(b"other" * 8, "a", raw) is None
    assert verify(SECRET, "a", raw[:-1] + b"X") is None
    assert verify(SECRET, "a", b"value") is None


def test_signed_values_round_trip(stores) -> None:
    signed, _, lines = stores
    signed.set("k", "v")
    assert signed.get("k") == b"v"
    assert signed.compare_set("k", "v", "w") == b"w"
    assert signed.compare_set("k", "v", "x") == b"w"
    assert signed.compare_set("new", "", "first") == b"first"
    assert lines == []


def test_a_forged_value_reads_as_absent_and_is_logged_once(stores) -> None:
    signed, plain, lines = stores
    plain.set("abort", pad("forged"))
    absent = "\0absent"
    assert signed.compare_set("abort", absent, absent) == absent.encode()  # a peek: nothing there
    assert signed.compare_set("abort", absent, absent) == absent.encode()
    assert len(lines) <= 1  # once per process (another test of this process may have logged it)
    assert signed.compare_set("abort", "", "ours") == b"ours"  # the forged value blocks nothing
    assert signed.get("abort") == b"ours"


def test_a_forged_value_read_with_get_is_replaced_by_the_last_good_one(stores) -> None:
    signed, plain, _ = stores
    signed.set("state", "good")
    plain.set("state", pad("gAWVpickle"))
    assert signed.get("state") == b"good"
    assert signed.compare_set("state", "good", "next") == b"next"
    plain.set("unknown", pad("x"))
    with pytest.raises(UnauthenticatedValue, match="not signed with the job's secret"):
        signed.get("unknown")


def test_counters_are_signed_and_count_every_add_of_concurrent_writers(stores) -> None:
    signed, plain, _ = stores
    plain.set("forged", "not a number")  # would make TCPStore's own add fail
    assert signed.add("forged", 1) == 1
    threads = [threading.Thread(target=lambda: [signed.add("count", 1) for _ in range(25)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert signed.add("count", 0) == 100
