"""One CUDA table: what runtime migration installs for a torch.cuda name is what its npu_migrate.cuda_api row says."""

from __future__ import annotations

import inspect

import pytest
import torch

from conftest import FAKE_NPU, child_env, run_cli
from npu_migrate import cuda_api
from npu_migrate.cuda_api import RUNTIME_KIND
from npu_migrate.errors import MigrationError
from npu_migrate.migrate.patches import cuda_namespace, streams


def _handled() -> dict[str, cuda_api.CudaApi | None]:
    """Every torch.cuda name runtime migration patches, with its row (None: it has none)."""
    names = [f"torch.cuda.{name}" for name, _ in cuda_namespace.public_callables()]
    names += [f"torch.cuda.nvtx.{name}" for name in streams.NVTX]
    names += [f"torch.cuda.{api.name}" for api in cuda_api.CUDA_API.values() if api.runtime == "amp"]
    return {name: cuda_api.classify(name) for name in names}


def _required_arguments(function: object) -> list[None]:
    """``None`` for each positional parameter torch's signature requires, so the call reaches the stand-in."""
    try:
        original = getattr(function, "_orig", function)  # a class stand-in's torch class
        parameters = inspect.signature(original).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    return [None for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def test_every_name_runtime_migration_handles_has_a_row() -> None:
    handled = _handled()
    assert "torch.cuda.synchronize" in handled and "torch.cuda.nvtx.range_push" in handled
    assert not [name for name, row in handled.items() if row is None]
    assert not [name for name, row in handled.items() if row.kind == "ignored"]


def test_a_runtime_kind_differs_from_the_port_kind_only_with_a_reason() -> None:
    rows = list(cuda_api.CUDA_API.values()) + [cuda_api.classify("torch.cuda.FloatTensor")]
    unexplained = [f"{r.name}: port {r.kind}, runtime {r.cpu_kind}" for r in rows
                   if r.cpu_kind is not None and r.cpu_kind != RUNTIME_KIND[r.kind] and not r.why]
    assert not unexplained, f"rows whose runtime kind differs without a `why`: {unexplained}"
    idle = [r.name for r in rows if (r.why or r.cpu_kind) and r.cpu_kind in (None, RUNTIME_KIND[r.kind])]
    assert not idle, f"rows with a `cpu_kind` equal to the port kind's, or a `why` for no difference: {idle}"


def test_every_cpu_answer_a_row_names_exists_and_each_is_used() -> None:
    named = {r.cpu for r in cuda_api.CUDA_API.values() if r.cpu}
    assert not named - set(cuda_namespace.CPU), "rows name cpu answers that npu_migrate.migrate has not"
    assert not set(cuda_namespace.CPU) - named, "cpu answers no row names"
    answered = [r.name for r in cuda_api.CUDA_API.values()
                if r.runtime_kind in ("redirected", "noop") and not r.cpu and not r.runtime
                and not r.name.startswith("nvtx")]
    assert not answered, f"rows that answer on cpu by their kind but name no cpu answer: {answered}"


def test_what_runtime_migration_installs_on_cpu_is_what_the_rows_say() -> None:
    """Each stand-in is called from user code: the report's kind is its row's, an unmapped one raises its advice."""
    from npu_migrate import migrate
    from npu_migrate.migrate.report import REPORT

    handled = _handled()
    errors: dict[str, str] = {}
    REPORT.reset()
    with migrate.enabled(device="cpu", device_count=2):
        for qualname in handled:
            owner: object = torch
            for part in qualname.split(".")[1:]:
                owner = getattr(owner, part)
            try:
                if qualname.endswith(("custom_fwd", "custom_bwd")):
                    owner(lambda ctx, x: x)
                else:
                    owner(*_required_arguments(owner))
            except MigrationError as exc:
                errors[qualname] = str(exc)
            except (TypeError, ValueError, RuntimeError):
                pass  # torch's own answer to a call without its arguments, after the stand-in was counted
        kinds = {api: entry["kind"] for api, entry in REPORT.entries.items()}
    wrong = []
    for qualname, row in handled.items():
        if row.runtime == "amp" and row.kind == "unsupported":
            continue  # torch.amp's decorator with the target's device_type: not a call to count
        if kinds.get(qualname) != row.runtime_kind:
            wrong.append(f"{qualname}: runs as {kinds.get(qualname)}, its row says {row.runtime_kind}")
        if row.runtime_kind == "unmapped" and row.note and row.note not in errors.get(qualname, ""):
            wrong.append(f"{qualname}: its error does not give the row's advice: {errors.get(qualname)!r}")
    assert not wrong, "\n".join(wrong)
    assert kinds["torch.cuda.synchronize"] == "noop" and kinds["torch.cuda.device_count"] == "redirected"
    assert errors["torch.cuda.CUDAGraph"] == ("torch.cuda.CUDAGraph has no cpu equivalent under runtime migration: "
                                              "CUDA graphs are an optimization: run without capture, or guard it "
                                              "with a device-type check.")


def test_a_row_without_a_cpu_answer_raises_its_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table decides: take a row's cpu answer away and the call raises the row's note."""
    from npu_migrate import migrate

    row = cuda_api.CUDA_API["memory_summary"]
    monkeypatch.setitem(cuda_api.CUDA_API, "memory_summary",
                        cuda_api.CudaApi("memory_summary", "unsupported", note="a note from the row"))
    with migrate.enabled(device="cpu"):
        with pytest.raises(MigrationError, match="torch.cuda.memory_summary has no cpu equivalent under runtime "
                                                 "migration: a note from the row."):
            torch.cuda.memory_summary()
    monkeypatch.setitem(cuda_api.CUDA_API, "memory_summary", row)
    with migrate.enabled(device="cpu"):
        assert torch.cuda.memory_summary() == ""


@pytest.mark.slow
@pytest.mark.fake_npu
def test_a_noop_row_answers_on_npu_where_torch_npu_lacks_the_name(tmp_path) -> None:
    """torch_npu has no get_arch_list, get_gencode_flags or is_tf32_supported: their rows' answers, not an error."""
    script = tmp_path / "queries.py"
    script.write_text("import torch\nprint(torch.cuda.get_arch_list(), repr(torch.cuda.get_gencode_flags()),\n"
                      "      torch.cuda.is_tf32_supported(), torch.cuda.is_bf16_supported())\n")
    result = run_cli("run", str(script), env=child_env(FAKE_NPU))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "''", "False", "True"]
