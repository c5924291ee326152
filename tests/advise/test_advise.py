"""``npu-migrate advise``: real runs of small scripts, judged against the real torch-npu wheels.

Each script marks the lines the advice must name with ``# advise: RULE``; the naive model must get
exactly those, its twin written the fused way none. Each run goes through ``npu_migrate.cli.main``,
as the console command does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ops.conftest import registers

from npu_migrate.advise import environment
from npu_migrate.cli import main

SCRIPTS = Path(__file__).with_name("scripts")
_ADVISED_ENV = {"TASK_QUEUE_ENABLE": "2", "CPU_AFFINITY_CONF": "1", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}


def advise(tmp_path: Path, script: str, *extra: str, release: str | None = None,
           args: tuple[str, ...] = ()) -> tuple[int, dict]:
    out = tmp_path / "advice.json"
    argv = ["advise", *(["--torch-npu", release] if release else []), "--json", str(out), *extra,
            str(SCRIPTS / script), *args]
    code = main(argv)
    return code, json.loads(out.read_text())


def marked(script: str) -> set[tuple[str, int]]:
    """``(rule, line)`` of every ``# advise: RULE[, RULE]`` comment of a script."""
    found = set()
    for number, line in enumerate((SCRIPTS / script).read_text().splitlines(), start=1):
        match = re.search(r"# advise: ([\w, ]+)", line)
        if match:
            found.update((rule.strip(), number) for rule in match.group(1).split(","))
    return found


def given(data: dict) -> set[tuple[str, int]]:
    return {(a["rule"], int(a["site"].rpartition(":")[2])) for a in data["advice"]}


def test_naive_model_gets_each_item_at_its_line(tmp_path: Path, release: str) -> None:
    code, data = advise(tmp_path, "naive_llama.py", release=release)
    assert code == 1 and data["torch_npu"] == release and data["steps"] == 2
    assert given(data) == marked("naive_llama.py")
    assert all(a["site"].startswith("tests/advise/scripts/naive_llama.py:") for a in data["advice"])
    by_rule = {a["rule"]: a for a in data["advice"]}
    assert by_rule["rms_norm"]["module"] == "RMSNorm" and by_rule["rms_norm"]["per_step"] == 2.0  # norm1, norm2
    assert by_rule["rms_norm"]["replace_with"].startswith("torch_npu.npu_rms_norm(")
    assert "npu::npu_rms_norm" in by_rule["rms_norm"]["evidence"]
    assert by_rule["attention"]["module"] == "Attention" and by_rule["attention"]["per_step"] == 1.0
    assert "scaled_dot_product_attention" in by_rule["attention"]["replace_with"]
    assert "npu_fusion_attention" in by_rule["attention"]["replace_with"]
    assert by_rule["swiglu"]["module"] == "SwiGLU" and "npu_swiglu" in by_rule["swiglu"]["replace_with"]
    assert by_rule["rotary"]["module"] == "Attention" and "npu_rotary_mul" in by_rule["rotary"]["replace_with"]
    assert by_rule["add_rms_norm"]["module"] == "Block"
    assert by_rule["fused_optimizer"]["replace_with"] == "torch.optim.AdamW(..., fused=True)"
    assert "aten::_fused_adamw_" in by_rule["fused_optimizer"]["evidence"]
    assert by_rule["host_sync"]["per_step"] == 1.0
    for item in data["advice"]:
        assert set(item) == {"rule", "replace_with", "site", "module", "per_step", "why", "evidence"}
        assert item["why"] and item["evidence"]


def test_fused_twin_gets_nothing(tmp_path: Path, release: str, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture) -> None:
    for name, value in _ADVISED_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("ASCEND_LAUNCH_BLOCKING", "ASCEND_GLOBAL_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    code, data = advise(tmp_path, "fused_llama.py", release=release)
    assert (code, data["advice"], data["env"]) == (0, [], [])
    good = "\n".join(data["good"])
    assert "is fused" in good and "2 workers, pinned memory" in good and "no host sync in the step" in good
    assert "no hand-written rms_norm, add_rms_norm, add_layer_norm, rotary, swiglu, geglu, attention" in good
    assert "Nothing to change." in capsys.readouterr().out


def test_environment_alone_is_advice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused twin in an environment left as it comes: only the variables are advised, and exit 1."""
    for name in _ADVISED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ASCEND_LAUNCH_BLOCKING", "1")
    code, data = advise(tmp_path, "fused_llama.py", release="2.14.0")
    assert code == 1 and data["advice"] == []
    assert {e["name"]: (e["value"], e["current"]) for e in data["env"]} == {
        "TASK_QUEUE_ENABLE": ("2", None), "CPU_AFFINITY_CONF": ("1", None),
        "PYTORCH_NPU_ALLOC_CONF": ("expandable_segments:True", None), "ASCEND_LAUNCH_BLOCKING": ("0", "1")}
    queue = next(e for e in data["env"] if e["name"] == "TASK_QUEUE_ENABLE")
    assert "peak" in queue["trade_off"] and "interactive" in queue["trade_off"]


@pytest.fixture
def _release_2_14(monkeypatch: pytest.MonkeyPatch) -> None:
    from ops.conftest import releases_dir

    if not any(releases_dir().glob("torch_npu-2.14.0-*.whl")):
        pytest.skip(f"torch-npu 2.14.0 is not cached in {releases_dir()}")
    monkeypatch.setenv("NPU_MIGRATE_RELEASES_DIR", str(releases_dir()))
    monkeypatch.setenv("PIP_NO_INDEX", "1")


test_environment_alone_is_advice = pytest.mark.usefixtures("_release_2_14")(test_environment_alone_is_advice)


@pytest.mark.parametrize(("version", "optimizer"), [("2.14.0", "torch.optim.SGD(..., fused=True)"),
                                                    ("2.1.0.post17", "torch_npu.optim.NpuFusedSGD(...)")])
def test_habits_of_the_step(tmp_path: Path, release: str, version: str, optimizer: str) -> None:
    """Optimizer, clip_grad_norm_, empty_cache, anomaly detection and float64, each at its line. The
    fused SGD kernel is registered by 2.14.0, not by 2.1.0.post17: there its NpuFusedSGD class."""
    if release != version:
        pytest.skip("one run per release")
    code, data = advise(tmp_path, "habits_train.py", release=release)
    assert code == 1
    assert marked("habits_train.py") <= given(data)
    (fused,) = [a for a in data["advice"] if a["rule"] == "fused_optimizer"]
    assert fused["replace_with"] == optimizer and fused["module"] == "SGD"
    # Anomaly detection's NaN check of each gradient is a host sync in the backward: counted in its
    # advice, not advised as a host_sync at loss.backward()'s line.
    assert given(data) == marked("habits_train.py")
    (anomaly,) = [a for a in data["advice"] if a["rule"] == "anomaly_detection"]
    assert re.search(r"its NaN check of each gradient is a host sync: \d+ per step in the backward", anomaly["why"])
    assert "in the backward at tests/advise/scripts/habits_train.py:18" in anomaly["evidence"]
    assert "no host sync in the step" not in data["good"]


def test_variants_users_write(tmp_path: Path, every_release: str) -> None:
    """One-line and T5 RMSNorms, SwiGLU through nn.SiLU and on chunks, GeGLU; Adam(fused=True), whose
    fused kernel some releases lack (2.1.0.post17, 2.6.0.post5: read from the wheel): there it is
    advised, with the release's NpuFusedAdam."""
    release = every_release
    code, data = advise(tmp_path, "variants_train.py", release=release)
    assert code == 1
    adam = 72
    lacks_fused_adam = not registers(release, "_fused_adam_")
    expected = marked("variants_train.py") | ({("fused_optimizer", adam)} if lacks_fused_adam else set())
    assert given(data) == expected
    by_line = {(a["rule"], int(a["site"].rpartition(":")[2])): a for a in data["advice"]}
    # The module is the one whose line multiplies, not nn.SiLU, where silu ran.
    assert by_line[("swiglu", 39)]["module"] == "LlamaMLP" and by_line[("swiglu", 52)]["module"] == "ChunkedGLU"
    # npu_geglu activates the right half with tanh's approximation unless told otherwise.
    assert "approximate=0, activate_left=True" in by_line[("geglu", 54)]["replace_with"]
    if lacks_fused_adam:
        fused = by_line[("fused_optimizer", adam)]
        assert fused["replace_with"] == "torch_npu.optim.NpuFusedAdam(...)" and fused["module"] == "Adam"
        assert fused["evidence"] == f"aten::_fused_adam_ not registered by torch-npu {release}"
    else:
        assert f"optimizer Adam at tests/advise/scripts/variants_train.py:{adam} is fused" in data["good"]


def test_multihead_attention_asked_for_its_weights(tmp_path: Path, release: str) -> None:
    code, data = advise(tmp_path, "mha_train.py", release=release)
    assert code == 1 and given(data) == marked("mha_train.py")
    (mha,) = [a for a in data["advice"] if a["rule"] == "mha_need_weights"]
    assert mha["module"] == "MultiheadAttention" and mha["per_step"] == 1.0
    assert "need_weights=False" in mha["replace_with"] and "npu::npu_fusion_attention" in mha["evidence"]


@pytest.mark.usefixtures("_release_2_14")
def test_pinned_batches_copied_without_non_blocking(tmp_path: Path) -> None:
    """Pinned memory overlaps the copy only with non_blocking=True: x's copy is advised, y's is not."""
    code, data = advise(tmp_path, "pinned_blocking_train.py", release="2.14.0")
    assert code == 1 and given(data) == marked("pinned_blocking_train.py")
    (copy,) = data["advice"]
    assert copy["replace_with"] == ".to(device, non_blocking=True)" and copy["per_step"] == 1.0
    assert "DataLoader at tests/advise/scripts/pinned_blocking_train.py:12: 2 workers, pinned memory" in data["good"]


@pytest.mark.usefixtures("_release_2_14")
def test_ddp_accumulation_without_no_sync_and_sync_batchnorm(tmp_path: Path) -> None:
    """Two micro-batches a step, each all-reducing; SyncBatchNorm asked for (kept BatchNorm on the CPU)."""
    code, data = advise(tmp_path, "ddp_train.py", release="2.14.0")
    assert code == 1 and given(data) == marked("ddp_train.py")
    (accumulate,) = [a for a in data["advice"] if a["rule"] == "ddp_no_sync"]
    assert accumulate["per_step"] == 2.0 and "no_sync" in accumulate["replace_with"]
    code, data = advise(tmp_path, "ddp_train.py", release="2.14.0", args=("fixed",))
    assert data["advice"] == [] and any("one gradient all-reduce per step" in g for g in data["good"])


def test_a_replacement_the_release_lacks_is_not_suggested(tmp_path: Path) -> None:
    """An operator list with npu::npu_rms_norm only: the hand-written RMSNorm is advised, the other
    patterns found are not (nothing to replace them with), nor fused AdamW (no _fused_adamw_)."""
    op_list = tmp_path / "ops.txt"
    op_list.write_text("npu::npu_rms_norm\naten::add.Tensor\naten::mm\n")
    code, data = advise(tmp_path, "naive_llama.py", "--op-list", str(op_list))
    assert code == 1
    rules = {a["rule"] for a in data["advice"]}
    assert "rms_norm" in rules
    assert not rules & {"add_rms_norm", "rotary", "swiglu", "attention", "fused_optimizer"}


def test_usage_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["advise", str(tmp_path / "missing.py")]) == 2
    assert main(["advise", "--ops-json", str(tmp_path / "no" / "ops.json"), str(SCRIPTS / "fused_llama.py")]) == 2
    # A folder for a report file is refused before the script runs, not a traceback after it.
    assert main(["advise", "--markdown", str(tmp_path), str(SCRIPTS / "fused_llama.py")]) == 2
    assert main(["ops", "--json", str(tmp_path), str(SCRIPTS / "fused_llama.py")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith(("npu-migrate advise: ", "npu-migrate ops: ")) for line in err)
    assert err[2] == f"npu-migrate advise: error: --markdown {str(tmp_path)!r} is a folder: name a file in it, " \
        f"such as {str(tmp_path / 'report')!r}."
    assert not captured.out  # nothing ran


@pytest.mark.parametrize(("env", "advised"), [
    ({}, {"TASK_QUEUE_ENABLE": "2", "CPU_AFFINITY_CONF": "1", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}),
    ({**_ADVISED_ENV, "ASCEND_GLOBAL_LOG_LEVEL": "0"}, {"ASCEND_GLOBAL_LOG_LEVEL": "3"}),
    ({**_ADVISED_ENV, "ASCEND_GLOBAL_LOG_LEVEL": "3", "ASCEND_LAUNCH_BLOCKING": "0"}, {}),
    ({**_ADVISED_ENV, "PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:128"},
     {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}),
    ({**_ADVISED_ENV, "CPU_AFFINITY_CONF": "2"}, {}),
])
def test_environment_rules(env: dict, advised: dict) -> None:
    changes, good = environment.check(env)
    assert {c["name"]: c["value"] for c in changes} == advised
    assert len(changes) + len(good) == len(environment.RULES)
    assert all(c["why"] and c["trade_off"] for c in changes)
