"""The pieces behind naming a lost node: addresses in a rank's error, and asking a launcher whether it is there.

The ping runs against a real TCPStore (a server in this process, or in a child that is killed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from conftest import free_port
from npu_migrate.launch.nodes.records import Failure, Member, read_failure
from npu_migrate.launch.nodes.liveness import Liveness, addresses_in, answer_pings, ask, lost_record, named_in
from npu_migrate.launch.nodes.values import PaddedStore

GLOO = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [192.0.2.2]:55509: "
        "Connection reset by peer. This is typically caused by a remote worker hanging")
MEMBERS = {0: Member(0, "gpu1 (192.0.2.1)", "own0", 0, "192.0.2.1"),
           1: Member(1, "gpu2 (192.0.2.2)", "own1", 0, "192.0.2.2"),
           2: Member(2, "gpu3 (2001:db8::3)", "own2", 0, "2001:db8::3")}


@pytest.mark.parametrize(("text", "found"), [
    (GLOO, ["192.0.2.2"]),
    ("connect to [2001:db8:0::3]:29500 failed; 10.0.0.7:1 refused", ["10.0.0.7", "2001:db8::3"]),
    ("ValueError: boom on rank 3", []),
    ("version 1.2.3.4.5 and 999.1.1.1", []),
])
def test_addresses_in_an_error(text: str, found: list[str]) -> None:
    assert addresses_in(text) == found


def test_the_named_nodes_are_the_other_members_with_those_addresses() -> None:
    assert [m.node_rank for m in named_in(GLOO, MEMBERS, me=0)] == [1]
    assert [m.node_rank for m in named_in("peer [2001:db8::3]:1", MEMBERS, me=0)] == [2]
    # Its own address: a rank of this node closed first, itself ended by another node's loss (seen
    # on namespace hosts: node 0 killed, rank 2 on node 1 failed on rank 3's closed connection).
    assert [m.node_rank for m in named_in(GLOO, MEMBERS, me=1)] == [0, 2]
    assert named_in("ValueError: boom on rank 3", MEMBERS, me=1) == []  # no address: no suspect
    assert named_in(GLOO, {k: Member(k, "h", "o", 0, None) for k in (0, 1)}, me=0) == []


def test_a_lost_record_puts_the_node_first_and_keeps_the_rank_failure() -> None:
    failure = Failure(1, 1, 0, "gpu1", exit_code=1, exc_type="DistBackendError", message=GLOO, time=100.0)
    record = lost_record(MEMBERS[1], Liveness.SILENT, 5.0, failure, 0, last_beat=98.5)
    assert record.message == ("lost node 1 (gpu2 (192.0.2.2)): its launcher stopped answering (no heartbeat "
                              "for 5 s); then rank 1 on node 0 lost its connection to 192.0.2.2")
    suspect = lost_record(MEMBERS[0], Liveness.SILENT, 5.0, replace(failure, rank=2), 1, last_beat=98.5)
    assert suspect.message.endswith("; then rank 2 on node 1 failed with a connection error")
    assert (record.kind, record.node_rank, record.owner, record.time) == ("lost", 1, "own1", 98.5)
    assert record.after is failure
    # On the wire and back (the board's fail/<gen>): the same record, the rank's failure under "after".
    wire = json.loads(json.dumps(record.record()))
    assert (wire["kind"], wire["after"]["kind"], wire["after"]["rank"]) == ("lost", "rank", 1)
    assert read_failure(json.dumps(wire)) == record


@pytest.fixture
def store():
    server = TCPStore("127.0.0.1", free_port(), None, True, timedelta(seconds=30), wait_for_workers=False)
    yield server


def _client(server: TCPStore, seconds: float = 30) -> PaddedStore:
    return PaddedStore(TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=seconds)))


def test_a_launcher_that_answers_is_alive(store) -> None:
    asker, owner = _client(store), _client(store)
    got: list[Liveness] = []
    thread = threading.Thread(target=lambda: got.append(ask(asker, lambda s: _client(store, s), "job", "own1", 60)))
    thread.start()
    owner.wait(["job/ping/own1"])  # asked: the counter exists
    assert answer_pings(owner, "job", "own1", 0) == 1  # the owner's heartbeat answers
    thread.join()
    assert got == [Liveness.ALIVE]


def test_a_launcher_that_never_answers_is_silent(store) -> None:
    asker = _client(store)
    assert ask(asker, lambda s: _client(store, s), "job", "own1", 0.5) is Liveness.SILENT


@pytest.mark.slow
def test_a_store_that_is_gone_means_node_0_ended() -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", (
        "import sys, datetime; from torch.distributed import TCPStore; "
        f"s = TCPStore('127.0.0.1', {port}, None, True, datetime.timedelta(seconds=30), wait_for_workers=False); "
        "print('up', flush=True); sys.stdin.read()")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        asker = PaddedStore(TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30)))
    finally:
        server.kill()
        server.wait()
    assert ask(asker, lambda s: PaddedStore(TCPStore("127.0.0.1", port, None, False, timedelta(seconds=s))),
               "job", "own1", 5) is Liveness.GONE
