"""``--profile``: real jobs of an unmodified script, on CPU and on the simulated NPU, and the flags' checks.

Each job's traces are loaded as a viewer would (JSON with ``traceEvents``, or torch-npu's list of
events), and must hold the script's operators and the ``ProfilerStep#N`` ranges of the chosen
optimizer steps; the launcher (or ``run``) ends with the summary lines.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch

from conftest import FAKE_NPU, child_env, free_port, run_cli
from support import Launch

from npu_migrate.profile import settings, summary

TRAIN = Path(__file__).resolve().parent / "scripts" / "train.py"
NAMES_THE_STEP_BEFORE = '"ProfilerStep#" + str(cur_step)' in inspect.getsource(torch.profiler.profile.step)
"""torch 2.1's ``profile.step()`` names the range it opens after the step that ended (#1, #1, #2...)."""


def trace_events(path: Path) -> list[dict]:
    """A Chrome trace's events: torch writes an object with ``traceEvents``, torch-npu a list."""
    data = json.loads(path.read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def check_trace(path: Path, steps: range) -> None:
    """The script's operators, and one ``ProfilerStep#N`` range per profiled step, named after its optimizer
    step (see :data:`NAMES_THE_STEP_BEFORE`)."""
    events = trace_events(path)
    names = {e.get("name") for e in events}
    assert "aten::addmm" in names or "aten::mm" in names, sorted(n for n in names if n)[:40]
    ranges = [e["name"] for e in events if str(e.get("name")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    assert len(ranges) == len(steps), ranges
    if NAMES_THE_STEP_BEFORE and path.name.endswith(".pt.trace.json"):
        assert set(ranges) <= {f"ProfilerStep#{s}" for s in range(steps.start - 1, steps.stop)}, ranges
    else:
        assert sorted(ranges) == sorted(f"ProfilerStep#{s}" for s in steps), ranges


def summaries(directory: Path) -> dict[int, dict]:
    return {json.loads(p.read_text())["rank"]: json.loads(p.read_text()) for p in directory.glob("rank*.profile.json")}


def test_launch_profiles_every_rank_on_cpu(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    job = Launch(tmp_path, "--device", "cpu", "--device-num", "2", "--profile", str(prof), str(TRAIN), "--ddp")
    assert job.wait() == 0, job.err
    traces = sorted(prof.glob("rank*.pt.trace.json"))
    assert [t.name.split(".")[0] for t in traces] == ["rank0", "rank1"], list(prof.iterdir())
    for trace in traces:
        check_trace(trace, range(3, 6))
    found = summaries(prof)
    assert sorted(found) == [0, 1]
    for rank, data in found.items():
        assert data["steps"] == [3, 4, 5] and len(data["step_times_s"]) == 3 and data["profiler"] == "torch.profiler"
        assert data["top"] and not any(name.startswith("ProfilerStep") for name, *_ in data["top"])
        assert (prof / data["trace"]).is_file()
    err = job.err
    assert "profiling optimizer steps 3-5 of every rank" in err  # the start-up line
    assert re.search(r"launch: rank 0: [\d.]+ (ms|us)/step \(median of steps 3-5\); top self time \(cpu\) per step: ", err), err
    assert re.search(r"launch: rank 1: ", err) and re.search(r"launch: slowest rank: [01] \(", err), err


@pytest.mark.slow
def test_chosen_steps_and_ranks(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    job = Launch(tmp_path, "--device", "cpu", "--device-num", "2", "--profile", str(prof), "--profile-steps", "2-3",
                 "--profile-ranks", "1", str(TRAIN), "--ddp", "--steps", "4")
    assert job.wait() == 0, job.err
    traces = sorted(prof.glob("rank*.pt.trace.json"))
    assert [t.name.split(".")[0] for t in traces] == ["rank1"]
    check_trace(traces[0], range(2, 4))
    assert summaries(prof)[1]["steps"] == [2, 3]
    assert "slowest rank" not in job.err  # one rank profiled: nothing to compare


@pytest.mark.slow
def test_run_profiles_its_process(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    result = run_cli("run", "--device", "cpu", "--profile", str(prof), "--profile-steps", "1-2", str(TRAIN), "--cuda")
    assert result.returncode == 0, result.stderr
    traces = list(prof.glob("rank0.*.pt.trace.json"))
    assert len(traces) == 1
    check_trace(traces[0], range(1, 3))
    assert summaries(prof)[0]["steps"] == [1, 2]
    assert "npu-migrate run: rank 0: " in result.stderr


@pytest.mark.slow
def test_ranks_a_script_spawns_are_named_by_their_process_group(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    env = child_env(PORT=str(free_port()))
    result = run_cli("run", "--device", "cpu", "--profile", str(prof), "--profile-steps", "2-3", "--profile-ranks", "1",
                     str(TRAIN.parent / "spawned.py"), env=env)
    assert result.returncode == 0, result.stderr
    assert sorted(summaries(prof)) == [1]  # rank 1 of the process group, though no RANK was set
    assert [t.name.split(".")[0] for t in prof.glob("*.pt.trace.json")] == ["rank1"]
    assert "npu-migrate run: rank 1: " in result.stderr


@pytest.mark.slow
def test_nothing_profiled_fails_the_job(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    result = run_cli("run", "--device", "cpu", "--profile", str(prof), "--profile-steps", "8-9", str(TRAIN), "--cuda")
    assert result.returncode == 1, result.stderr
    assert "error: --profile" in result.stderr and "no rank profiled optimizer steps 8-9" in result.stderr
    assert not list(prof.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("own, line", [
    # The script's profiler records steps 1-3: --profile (3-5) would start beside it at the end of step 1.
    (1, "rank {r}: not profiled: the script's own profiler was recording at step 2 (a process runs one profiler "
        "at a time; choose --profile-steps outside the script's)"),
    # It starts at step 4, while --profile records: --profile stops first, keeping step 3.
    (4, "; stopped there: the script's own profiler started at step 4"),
])
def test_the_scripts_own_profiler_comes_first(tmp_path: Path, own: int, line: str) -> None:
    """Two profilers in one process cancel each other (torch 2.1 to 2.6: the first one's stop raises in
    whichever code stops it): --profile steps aside, the script's profile is whole, the job ends 0."""
    prof = tmp_path / "prof"
    job = Launch(tmp_path, "--device", "cpu", "--device-num", "2", "--profile", str(prof), str(TRAIN), "--ddp",
                 "--own-profile", str(own))
    assert job.wait() == 0, job.err
    counts = [int(n) for n in re.findall(r"rank[01]\] own profile: (\d+) events", job.outtext)]
    assert len(counts) == 2 and min(counts) > 100, job.outtext  # the script's own: its steps' operators
    found = summaries(prof)
    assert sorted(found) == [0, 1]
    for rank, data in found.items():
        assert data["yielded"] == ([2, "was recording"] if own == 1 else [4, "started"])
        assert data["steps"] == ([] if own == 1 else [3])
        assert line.format(r=rank) in job.err, job.err
        if own == 4:
            names = {e.get("name") for e in trace_events(prof / data["trace"])}
            assert "ProfilerStep#3" in names or NAMES_THE_STEP_BEFORE, sorted(n for n in names if n)[:40]
            assert "aten::addmm" in names or "aten::mm" in names
    assert "Traceback" not in job.err


@pytest.mark.slow
@pytest.mark.fake_npu
def test_the_simulated_npu_takes_the_torch_npu_profiler(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    job = Launch(tmp_path, "--migrate", "--device-num", "2", "--profile", str(prof), str(TRAIN), "--cuda", "--ddp",
                 paths=(FAKE_NPU,), ASCEND_RT_VISIBLE_DEVICES="0,1")
    assert job.wait() == 0, job.err
    found = summaries(prof)
    assert sorted(found) == [0, 1]
    for rank, data in found.items():
        assert data["profiler"] == "torch_npu.profiler" and data["device"] == "npu"
        runs = list(prof.glob(f"rank{rank}_*_ascend_pt"))
        assert len(runs) == 1
        output = runs[0] / "ASCEND_PROFILER_OUTPUT"
        assert (output / "operator_details.csv").is_file()
        check_trace(output / "trace_view.json", range(3, 6))
        assert data["trace"] == str((output / "trace_view.json").relative_to(prof))
    assert re.search(r"launch: slowest rank: [01] \(", job.err), job.err


@pytest.mark.parametrize("flags, message", [
    (["--profile", "{tmp}/p", "--profile-steps", "5-2"], "--profile-steps '5-2' is empty: the last step 2 comes before the first 5."),
    (["--profile", "{tmp}/p", "--profile-steps", "x"], "--profile-steps 'x' is not a step range."),
    (["--profile", "{tmp}/p", "--profile-ranks", "3-1"], "--profile-ranks '3-1' is not a list of ranks."),
    (["--profile", "{tmp}/file"], "is a file; expected a directory for the ranks' traces."),
    (["--profile-steps", "3-5"], "--profile-steps needs --profile DIR"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, flags: list[str], message: str) -> None:
    (tmp_path / "file").write_text("")
    argv = [f.format(tmp=tmp_path) for f in flags]
    for command in (["launch", "--device", "cpu"], ["run", "--device", "cpu"]):
        result = run_cli(*command, *argv, str(TRAIN), timeout=60)
        assert result.returncode == 2, (command, result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], (command, result.stderr)
        assert not (tmp_path / "p").exists() or not list((tmp_path / "p").iterdir())


def test_steps_and_ranks_are_read() -> None:
    assert settings.parse_steps(None) == settings.DEFAULT_STEPS == (3, 5)
    assert settings.parse_steps("4") == (4, 4) and settings.parse_steps(" 2 - 7 ") == (2, 7)
    with pytest.raises(settings.ProfileError, match="count from 1"):
        settings.parse_steps("0-2")
    assert settings.parse_ranks("all") is None and settings.parse_ranks("0,2-3") == (0, 2, 3)
    chosen = settings.ProfileSettings("d", 2, 4, (1,), "tok")
    assert settings.ProfileSettings.from_env(chosen.to_env()) == settings.ProfileSettings(
        str(Path("d").resolve()), 2, 4, (1,), "tok")
    assert chosen.profiles(1) and not chosen.profiles(0)


def test_the_summary_reads_only_this_job(tmp_path: Path) -> None:
    chosen = settings.ProfileSettings(str(tmp_path), 3, 5, None, "this")
    for rank, job, times in ((0, "this", [0.010, 0.012, 0.011]), (1, "this", [0.020, 0.021, 0.022]),
                             (2, "earlier", [0.5])):
        (tmp_path / f"rank{rank}.profile.json").write_text(json.dumps({
            "job": job, "rank": rank, "steps": [3, 4, 5][:len(times)], "step_times_s": times, "self_time": "cpu",
            "top": [["aten::mm", 1500.0, 3], ["aten::add", 20.0, 3]], "trace": f"rank{rank}.1.pt.trace.json"}))
    lines, nothing = summary.lines(chosen)
    assert not nothing
    assert lines[1] == ("rank 0: 11.0 ms/step (median of steps 3-5); top self time (cpu) per step: aten::mm 1.5 ms, "
                        "aten::add 20 us; trace rank0.1.pt.trace.json")
    assert lines[-1] == "slowest rank: 1 (21.0 ms/step, 1.91x the fastest)"
    assert len(lines) == 4  # the heading, ranks 0 and 1: not the earlier job's rank 2
