"""torch.cuda's calls reach torch.npu's function with the arguments the torch-npu release's signature takes.

Runtime migration sends ``torch.cuda.X`` to ``torch.npu.X``, whose parameters are the release's:
``is_bf16_supported(including_emulation=...)`` met a TypeError on every release whose function takes
no argument, ``get_device_name(device=0)`` on every release (``device_name`` there). Here:

* the adaptation (:mod:`npu_migrate.migrate.fit`) on plain functions and classes that lack a parameter;
* for each release of the stand-in's table (tests/fake_npu/torch_npu/releases.json, generated from
  the wheels), each name runtime migration redirects: torch.cuda's signature on the running torch
  against the release's, every parameter the release lacks decided by its row, and calls of every
  parameter either reaching the release's signature or refused in one line;
* end to end on the stand-in NPU: a CUDA script under ``npu-migrate run`` (the release of this
  torch), and the same calls under migration with the stand-in simulating an older release.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from npu_migrate import cuda_api
from npu_migrate.cuda_api.row import CudaOnly, drop, refuse
from npu_migrate.errors import MigrationError
from npu_migrate.migrate import fit
from npu_migrate.migrate.patches import cuda_namespace

from conftest import FAKE_NPU, MIGRATE_SCRIPTS, ROOT, child_env, fake_npu_release_table, run_cli


release_table = fake_npu_release_table()
RELEASES = release_table.load()
RELEASE = "torch-npu 9.9.9"
P = inspect.Parameter


def adapted(cuda: Any, target: Any, *cuda_only: CudaOnly) -> Any:
    return fit.fitted(f"torch.cuda.{cuda.__name__}", cuda, target, cuda_only, f"torch.npu.{target.__name__}",
                      RELEASE)


# --------------------------------------------------------------------------- the adaptation


def test_a_target_that_takes_every_call_is_used_as_it_is() -> None:
    def memory_allocated(device=None):  # noqa: ANN001, ANN202
        return device

    def npu_memory_allocated(device=None):  # noqa: ANN001, ANN202
        return device

    assert adapted(memory_allocated, npu_memory_allocated) is npu_memory_allocated


def test_an_argument_whose_meaning_does_not_apply_is_left_out() -> None:
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        raise AssertionError("torch.cuda's own is never called")

    def npu_is_bf16_supported() -> bool:  # torch-npu 2.9.1's
        return True

    call = adapted(is_bf16_supported, npu_is_bf16_supported,
                   drop("including_emulation", "no emulated bfloat16"))
    assert call() is True
    assert call(including_emulation=False) is True
    assert call(False) is True
    assert call(including_emulation=True) is True
    assert inspect.signature(call) == inspect.signature(is_bf16_supported)  # what user code sees is torch.cuda's
    with pytest.raises(TypeError, match=r"^is_bf16_supported\(\) got an unexpected keyword argument 'emulation'$"):
        call(emulation=False)  # a call torch.cuda's refuses is refused as torch would
    with pytest.raises(TypeError, match=r"^is_bf16_supported\(\) too many positional arguments$"):
        call(True, True)


def test_an_argument_that_would_change_the_answer_is_refused_in_one_line() -> None:
    def memory_snapshot(mempool_id=None, include_traces=True):  # noqa: ANN001, ANN202
        raise AssertionError("torch.cuda's own is never called")

    def npu_memory_snapshot():  # noqa: ANN202 - torch-npu 2.12.0.post3's
        return ["segment"]

    call = adapted(memory_snapshot, npu_memory_snapshot,
                   refuse("mempool_id", "the snapshot would hold every pool's segments"),
                   drop("include_traces", "a lighter snapshot"))
    assert call() == call(None) == call(mempool_id=None) == call(include_traces=False) == ["segment"]
    with pytest.raises(MigrationError) as refused:
        call(mempool_id=(1, 2))
    assert str(refused.value) == (
        "torch.cuda.memory_snapshot(mempool_id=(1, 2)) cannot run on torch-npu 9.9.9: its "
        "torch.npu.npu_memory_snapshot takes no mempool_id, and the snapshot would hold every pool's segments; "
        "guard the call with a device-type check, or use a torch-npu release whose "
        "torch.npu.npu_memory_snapshot takes mempool_id.")
    with pytest.raises(MigrationError, match=r"^torch\.cuda\.memory_snapshot\(mempool_id=\(3, 4\)\) cannot run"):
        call((3, 4), False)  # positionally too


def test_an_argument_no_row_decides_is_refused_unless_it_is_the_default() -> None:
    def synchronize(device=None, *, fence=False):  # noqa: ANN001, ANN202
        raise AssertionError("never called")

    def npu_synchronize(device=None):  # noqa: ANN001, ANN202
        return ("synchronized", device)

    call = adapted(synchronize, npu_synchronize)
    assert call(1, fence=False) == ("synchronized", 1)
    with pytest.raises(MigrationError, match=r"^torch\.cuda\.synchronize\(fence=True\) cannot run on torch-npu "
                                             r"9\.9\.9: its torch\.npu\.npu_synchronize takes no fence, and "
                                             + fit.UNDECIDED):
        call(fence=True)
    with pytest.raises(MigrationError, match=r"\(fence=tensor\(\[1\.\]\)\)"):  # a tensor is never taken for the default
        call(fence=torch.ones(1))


def test_a_parameter_named_otherwise_at_the_same_place_takes_the_keyword() -> None:
    def can_device_access_peer(device, peer_device):  # noqa: ANN001, ANN202
        raise AssertionError("never called")

    def npu_can_device_access_peer(device_id, peer_device_id):  # noqa: ANN001, ANN202
        return (device_id, peer_device_id)

    call = adapted(can_device_access_peer, npu_can_device_access_peer)
    assert call(0, 1) == call(0, peer_device=1) == call(device=0, peer_device=1) == (0, 1)
    assert call(peer_device=1, device=0) == (0, 1)
    with pytest.raises(TypeError, match=r"missing a required argument: 'peer_device'"):
        call(device=0)


def test_a_parameter_at_another_place_is_passed_by_name() -> None:
    """torch.cuda.graph's capture_error_mode is its 4th parameter, torch.npu.graph's 5th (after
    auto_dispatch_capture): a positional 4th argument must not land in auto_dispatch_capture."""
    def graph(cuda_graph, pool=None, stream=None, capture_error_mode="global",  # noqa: ANN001, ANN202
              enable_annotations=False):  # noqa: ANN001
        raise AssertionError("never called")

    def npu_graph(npu_graph, pool=None, stream=None, auto_dispatch_capture=False,  # noqa: ANN001, ANN202
                  capture_error_mode="global"):  # noqa: ANN001
        return (npu_graph, pool, stream, auto_dispatch_capture, capture_error_mode)

    call = adapted(graph, npu_graph, drop("enable_annotations", "annotations are CUDA's"))
    assert call("g", None, None, "relaxed", True) == ("g", None, None, False, "relaxed")
    assert call(cuda_graph="g", capture_error_mode="thread_local") == ("g", None, None, False, "thread_local")
    assert call("g", stream="s") == ("g", None, "s", False, "global")


def test_a_class_is_built_with_the_arguments_it_takes() -> None:
    class Event:
        def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):  # noqa: ANN001
            raise AssertionError("never called")

    class NpuEvent:
        def __init__(self, enable_timing=False, blocking=False, interprocess=False):  # noqa: ANN001
            self.enable_timing = enable_timing

    make = adapted(Event, NpuEvent, refuse("external", "it would be an internal dependency"))
    assert make(True).enable_timing is True
    assert isinstance(make(enable_timing=True, external=False), NpuEvent)
    with pytest.raises(MigrationError, match=r"^torch\.cuda\.Event\(external=True\) cannot run on torch-npu 9\.9\.9"):
        make(True, False, False, True)


def test_keywords_gathered_by_torch_cuda_reach_a_target_that_gathers_them() -> None:
    def Stream(device=None, priority=0, **kwargs):  # noqa: ANN001, ANN003, ANN202, N802
        raise AssertionError("never called")

    def npu_stream(device=None, priority=0, **kwargs):  # noqa: ANN001, ANN003, ANN202
        return device, priority, kwargs

    assert adapted(Stream, npu_stream) is npu_stream

    def npu_stream_without(device=None, priority=0):  # noqa: ANN001, ANN202
        return device, priority

    call = adapted(Stream, npu_stream_without)
    assert call(1, priority=-1) == (1, -1)
    with pytest.raises(MigrationError, match=r"^torch\.cuda\.Stream\(stream_id=7\) cannot run"):
        call(stream_id=7)


def test_each_signature_is_read_once_not_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def empty_cache(device=None):  # noqa: ANN001, ANN202
        raise AssertionError("never called")

    def npu_empty_cache(device_name=None):  # noqa: ANN001, ANN202
        return device_name

    reads: list[Any] = []
    real = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda obj, *a, **k: reads.append(obj) or real(obj, *a, **k))
    call = adapted(empty_cache, npu_empty_cache)
    assert sorted(reads, key=id) == sorted([empty_cache, npu_empty_cache], key=id)
    again = adapted(empty_cache, npu_empty_cache)  # installed again (migration off and on): cached
    assert len(reads) == 2
    for device in range(100):
        assert call(device=device) == again(device) == device
    assert len(reads) == 2


# --------------------------------------------------------------------------- every release of the table


class Released:
    """A function with a release's signature: refuses what the release refuses, records what it gets."""

    def __init__(self, name: str, text: str) -> None:
        self.__name__ = name
        self.__signature__ = release_table.signature(text)

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(self.__signature__.bind(*args, **kwargs).arguments)  # the release's TypeError


class Value:
    """A value no default equals, that each parameter receives in turn."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


def redirected(release: Any) -> list[tuple[str, Any, inspect.Signature, Any]]:
    """(name, torch.cuda's object, its signature on this torch, the row) for each name runtime migration
    sends to torch.npu that ``release`` has with a Python signature."""
    found = []
    for name in cuda_namespace.redirected_to_device_module():
        text = release.signatures.get(name)
        ours = fit.signature(getattr(torch.cuda, name))
        if text is None or name in release.absent or ours is None:
            continue
        found.append((name, text, ours, cuda_api.classify(f"torch.cuda.{name}")))
    return found


@pytest.mark.parametrize("release", RELEASES, ids=[r.version for r in RELEASES])
def test_every_redirected_call_fits_the_release_or_is_adapted(release: Any) -> None:
    undecided, uncovered, failed = [], [], []
    for name, text, ours, row in redirected(release):
        target = Released(name, text)
        how = fit.plan(ours, target.__signature__, row.cuda_only if row is not None else ())
        api = f"torch.cuda.{name}{ours}"
        undecided += [f"{api}: {p} (torch-npu {release.version}: {name}{text})"
                      for p, step in how.steps.items() if step.kind == "refuse" and step.why == fit.UNDECIDED]
        uncovered += [f"{api}: torch-npu {release.version}'s {name}{text} requires {p}" for p in how.uncovered]
        call = fit.fitted(f"torch.cuda.{name}", getattr(torch.cuda, name), target,
                          row.cuda_only if row is not None else (), f"torch.npu.{name}", f"torch-npu {release.version}")
        params = [p for p in ours.parameters.values() if p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
        required = {p.name: Value(p.name) for p in params if p.default is P.empty}
        # Every parameter by keyword, with its default and with another value; all of them by place.
        calls = [({}, {**required, p.name: value}) for p in params
                 for value in ((p.default,) if p.default is not P.empty else ()) + (Value(p.name),)]
        positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
        calls.append(([Value(p.name) for p in positional], {}))
        for args, kwargs in calls:
            shown = f"{name}({', '.join([repr(a) for a in args] + [f'{k}={v!r}' for k, v in kwargs.items()])})"
            try:
                got = call(*args, **kwargs)
            except MigrationError as exc:
                line = str(exc)
                refused = [k for k, v in kwargs.items() if isinstance(v, Value)] + [a.name for a in args]
                step = next((how.steps[p] for p in refused if how.steps[p].kind == "refuse"), None)
                if step is None or "\n" in line or not line.startswith(f"torch.cuda.{name}(") or \
                        f"torch-npu {release.version}" not in line:
                    failed.append(f"{shown}: refused without a reason of its row: {line}")
                continue
            except TypeError as exc:
                failed.append(f"{shown}: TypeError on torch-npu {release.version}'s {name}{text}: {exc}")
                continue
            # What torch.cuda's call said arrives under the release's name for it, or was left out by decision.
            for given in [*args, *kwargs.values()]:
                if isinstance(given, Value) and given not in got.values() and how.steps[given.name].kind != "drop":
                    failed.append(f"{shown}: {given!r} did not reach torch-npu {release.version}'s {name}{text}")
    assert not undecided, ("torch.cuda parameters the release lacks, with no decision in their row (cuda_only in "
                           "npu_migrate/cuda_api/namespace.py: drop or refuse, and why):\n" + "\n".join(undecided))
    assert not uncovered, "\n".join(uncovered)
    assert not failed, "\n".join(failed)


def test_each_decision_of_the_table_is_about_a_parameter_a_release_lacks() -> None:
    """A row's cuda_only entry for a parameter every release of the table takes (or for a name no
    release has) is stale; each says what it does, and why."""
    stale = []
    for row in cuda_api.CUDA_API.values():
        for decision in row.cuda_only:
            assert decision.action in ("drop", "refuse") and decision.why, decision
            if not any(r.signatures.get(row.name) is not None and decision.param not in
                       release_table.signature(r.signatures[row.name]).parameters for r in RELEASES):
                stale.append(f"torch.cuda.{row.name}: {decision.param}")
    assert not stale, f"decisions for parameters every release of the table takes: {stale}"


# --------------------------------------------------------------------------- end to end on the stand-in

SCRIPT = """\
import torch
print(torch.cuda.is_bf16_supported(including_emulation=False), torch.cuda.get_device_name(device=1),
      torch.cuda.get_device_properties(device=0).name, torch.cuda.can_device_access_peer(device=0, peer_device=1))
with torch.cuda.StreamContext(stream=torch.cuda.current_stream()):
    start, end = torch.cuda.Event(enable_timing=True, external=False), torch.cuda.Event(enable_timing=True)
    start.record()
    x = torch.ones(4, device="cuda") * 2
    end.record()
torch.cuda.synchronize()
print(x.device, start.elapsed_time(end) >= 0, torch.cuda.memory_snapshot(include_traces=False))
torch.cuda.Event(enable_timing=True, external=True)
print("not reached")
"""


@pytest.mark.slow
@pytest.mark.fake_npu
def test_a_cuda_script_on_the_simulated_npu_of_this_torch(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = run_cli("run", str(script), env=child_env(FAKE_NPU, FAKE_NPU_DEVICE_COUNT="2"))
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        "True FakeAscend910B (simulated 1) FakeAscend910B (simulated 0) True", "npu:0 True []"]
    version = release_table.pick(torch.__version__, RELEASES).version  # what the stand-in simulates here
    assert result.stderr.strip().splitlines()[-1] == (
        f"npu-migrate: error: torch.cuda.Event(external=True) cannot run on torch-npu {version}: its torch.npu.Event "
        f"takes no external, and {cuda_api.classify('torch.cuda.Event').cuda_only[0].why}; guard the call with a "
        f"device-type check, or use a torch-npu release whose torch.npu.Event takes external.")


def _newest_release_lacking(*pairs: tuple[str, str]) -> Any:
    """The newest release of the table whose torch.npu functions lack every (name, parameter) of ``pairs``."""
    for release in RELEASES:
        if all(release.signatures.get(name) is not None
               and param not in release_table.signature(release.signatures[name]).parameters for name, param in pairs):
            return release
    return None


@pytest.mark.slow
@pytest.mark.fake_npu
def test_the_calls_that_failed_on_older_releases_run_under_migration() -> None:
    """The stand-in simulating a release whose is_bf16_supported, memory_snapshot and MemPool take
    none of CUDA's newer arguments (read from the table): the calls run, or are refused in one line,
    where they raised TypeError before."""
    release = _newest_release_lacking(("is_bf16_supported", "including_emulation"), ("memory_snapshot", "mempool_id"),
                                      ("MemPool", "use_on_oom"))
    assert release is not None, "no release of the table lacks all three: pick the cases again"
    result = subprocess.run([sys.executable, str(MIGRATE_SCRIPTS / "older_release_calls.py")], capture_output=True,
                            text=True, timeout=120, cwd=ROOT,
                            env=child_env(FAKE_NPU, **{release_table.ENV: release.version}))
    assert result.returncode == 0, result.stderr
    pool_refusal = next(c.why for c in cuda_api.classify("torch.cuda.MemPool").cuda_only if c.param == "use_on_oom")
    snapshot_refusal = next(c.why for c in cuda_api.classify("torch.cuda.memory_snapshot").cuda_only
                            if c.param == "mempool_id")
    assert result.stdout.splitlines() == [
        f"torch-npu {release.version}",
        "without migration: TypeError: is_bf16_supported() got an unexpected keyword argument 'including_emulation'",
        "is_bf16_supported: True True",
        "memory_snapshot: [] []",
        "MemPool: MemPool MemPool",
        f"MigrationError: torch.cuda.MemPool(use_on_oom=True) cannot run on torch-npu {release.version}: its "
        f"torch.npu.MemPool takes no use_on_oom, and {pool_refusal}; guard the call with a device-type check, or use "
        f"a torch-npu release whose torch.npu.MemPool takes use_on_oom.",
        f"MigrationError: torch.cuda.memory_snapshot(mempool_id=(1, 2)) cannot run on torch-npu {release.version}: "
        f"its torch.npu.memory_snapshot takes no mempool_id, and {snapshot_refusal}; guard the call with a "
        f"device-type check, or use a torch-npu release whose torch.npu.memory_snapshot takes mempool_id.",
    ]
