"""Failure records on the wire: each kind goes out as JSON and comes back as the same typed record,
and whatever else sits in ``fail/<gen>`` is read without trusting its shape."""

from __future__ import annotations

import json

import pytest

from npu_migrate.launch.hangs.watchdog import Hang
from npu_migrate.launch.nodes.records import (
    Ended,
    Failure,
    FailureKind,
    HangFailure,
    LostNode,
    Unreadable,
    order,
    read_failure,
)
from npu_migrate.launch.procs.failure import explain

RANK = Failure(1, 1, 0, "gpu7", exit_code=1, exc_type="ValueError", message="boom", traceback="tb\n", time=20.0)


@pytest.mark.parametrize("record", [
    RANK,
    LostNode(1, "gpu8 (10.0.0.8)", "own1", "lost node 1 (gpu8 (10.0.0.8)): no heartbeat for 5 s"),
    LostNode(0, "gpu7", None, "lost node 0 (gpu7): its store stopped answering", 19.5, RANK),
    Hang({0: {"state": "in all_reduce"}, 1: {"state": "idle"}}, [1], "rank 1 is idle", 481.0, 30.0).failure(),
    Ended(FailureKind.ABORT, "the launcher of node 1 received SIGTERM"),
])
def test_every_kind_comes_back_from_the_wire_as_it_went(record) -> None:
    wire = json.dumps(record.record())
    again = read_failure(wire)
    assert again == record and type(again) is type(record)
    assert json.dumps(again.record()) == wire  # the same JSON: for peers, and in the report


def test_the_wire_keys_are_the_ones_they_always_were() -> None:
    assert RANK.record()["kind"] == "rank" and RANK.record()["message_line"] == RANK.headline()
    assert list(LostNode(1, "h", "o", "m").record()) == ["kind", "node_rank", "host", "owner", "message"]
    assert list(Hang({}, [], "s", 1.0, 2.0).failure().record()) == ["kind", "message", "behind", "states",
                                                                   "stalled_s", "time"]
    assert Ended(FailureKind.PREFLIGHT, "p").record() == {"kind": "preflight", "message": "p"}


@pytest.mark.parametrize("text", [
    "not json", "[1, 2]", "null", '{"kind": "rank", "rank": 1}', '{"kind": ["x"], "message": 3}',
    '{"kind": "weird", "message": "it broke", "time": "soon"}',
])
def test_what_no_launcher_writes_is_unreadable_and_still_explained(text: str) -> None:
    record = read_failure(text)
    assert isinstance(record, Unreadable)
    headline, lines, restartable = explain(record, 0)
    assert headline.startswith("the job failed: ") and lines == [] and restartable
    assert order(record) == (False, 0.0)


def test_fields_of_the_wrong_type_are_not_trusted() -> None:
    lost = read_failure({"kind": "lost", "node_rank": "0", "host": 7, "after": {"kind": "rank"}, "time": "x"})
    assert lost == LostNode(None, "", None, "lost node None ()") and order(lost) == (False, 0.0)
    hang = read_failure({"kind": "hang", "behind": "1", "states": [], "stalled_s": None})
    assert hang == HangFailure("hang", [], {}, 0.0, 0.0)
    rank = read_failure({"rank": 1, "local_rank": 0, "node_rank": 1, "host": "h", "time": "late"})
    assert isinstance(rank, Failure) and rank.time == 0.0  # no kind: a rank's, as it always was


def test_a_lost_node_0_ends_the_job_and_names_the_failure_after_it() -> None:
    lost = LostNode(0, "gpu7", None, "lost node 0 (gpu7)", 19.5, RANK)
    headline, lines, restartable = explain(read_failure(json.dumps(lost.record())), 1)
    assert headline.endswith("so the job ends on every node.") and not restartable
    assert lines == [f"after it: {RANK.headline()}"]
    assert explain(RANK, 1)[0] == RANK.headline() + " on node 0"
