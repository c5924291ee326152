"""The launcher's command layer: one options object (flags, ``spawn()``, ``make_config``) and pluggable features.

What a user or an extension sees: every flag lands in :class:`LaunchOptions` with the parser's
default; ``spawn()`` keeps its keyword arguments; a feature registered with
:func:`npu_migrate.launch.features.register` gets its flag, its checks and its hooks in order,
and what it made is cleaned up when the job is refused; ``launch/`` imports neither ``migrate/``
nor ``compare/``.
"""

from __future__ import annotations

import argparse
import ast
import os
import socket
from pathlib import Path

import pytest

from conftest import ROOT, child_env, run_cli
from npu_migrate.launch import features
from npu_migrate.launch.cli import build_parser, main
from npu_migrate.launch.setup.config import make_config
from npu_migrate.launch.features import FeatureJob, LaunchFeature
from npu_migrate.launch.setup.options import LaunchOptions

SPAWN_KEYWORDS = ("nproc", "nnodes", "node_rank", "addr", "port", "device", "log_dir", "max_restarts", "join_timeout",
                  "job_id", "node_timeout", "output")
"""``spawn()``'s keyword arguments before the options object: callers pass them still."""


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


def test_launch_imports_no_feature_and_no_feature_imports_launch() -> None:
    launch = [f"{p.name}: {n}" for p in sorted((ROOT / "npu_migrate" / "launch").glob("*.py")) for n in _imports(p)
              if n.startswith(("npu_migrate.migrate", "npu_migrate.compare"))]
    assert launch == []
    built_in = [ROOT / (name.replace(".", "/") + ".py") for name in features.BUILT_IN]
    assert [f"{p.name}: {n}" for p in built_in for n in _imports(p) if n.startswith("npu_migrate.launch")] == []


def test_parser_defaults_are_the_options_defaults() -> None:
    options = LaunchOptions.from_args(build_parser().parse_args(["train.py"]))
    assert options == LaunchOptions(output=options.output)


def test_every_option_has_its_flag() -> None:
    argv = ["--device-num", "3", "--nnodes", "2", "--node-rank", "1", "--addr", "10.0.0.1", "--port", "29600",
            "--device", "cpu", "--log-dir", "logs", "--max-restarts", "2", "--join-timeout", "9", "--job-id", "j1",
            "--node-timeout", "30", "--hang-timeout", "7", "--hang-action", "report", "--error-file", "e.json",
            "--preflight", "--rank-table-timeout", "4", "--tee", "train.py"]
    options = LaunchOptions.from_args(build_parser().parse_args(argv))
    assert options == LaunchOptions(nproc=3, nnodes=2, node_rank=1, addr="10.0.0.1", port=29600, device="cpu",
                                    log_dir="logs", max_restarts=2, join_timeout=9.0, job_id="j1", node_timeout=30.0,
                                    hang_timeout=7.0, hang_action="report", error_file="e.json", preflight=True,
                                    output=options.output, rank_table_timeout=4.0)
    assert options.output.tee and set(LaunchOptions.names()) - {"output"} <= set(vars(build_parser().parse_args(argv)))


def test_spawn_keywords_and_make_config_forms_agree() -> None:
    assert set(SPAWN_KEYWORDS) <= set(LaunchOptions.names())
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = int(sock.getsockname()[1])
    given = {"nproc": 2, "device": "cpu", "port": port, "job_id": "same"}
    env = {"OMP_NUM_THREADS": "1"}
    by_keywords = make_config(environ=env, **given)
    assert make_config(LaunchOptions(**given), environ=env) == by_keywords
    assert make_config(2, environ=env, **{k: v for k, v in given.items() if k != "nproc"}) == by_keywords
    with pytest.raises(TypeError, match=r"unknown launch option\(s\) 'nprocs': expected some of nproc, nnodes"):
        make_config(nprocs=2)


def test_spawn_refuses_an_unknown_keyword_before_starting_anything() -> None:
    from npu_migrate.launch import spawn

    with pytest.raises(TypeError, match="unknown launch option"):
        spawn(print, nproc=1, device="cpu", node_timout=30)


# --------------------------------------------------------------------------- features


class Recorder:
    """A feature's job as an extension writes one: plain methods, nothing imported from the launcher."""

    def __init__(self, calls: list[str], name: str, wants: int | None = None, fails: bool = False) -> None:
        self.calls, self.name, self.wants, self.fails = calls, name, wants, fails

    def prepare(self) -> None:
        self.calls.append(f"{self.name}.prepare")
        if self.fails:
            raise RuntimeError("prepare failed")

    def describe(self, device: str) -> str:
        return f"{self.name} on {device}"

    def finish(self, code: int | None, say) -> int | None:
        self.calls.append(f"{self.name}.finish({code})")
        say(f"{self.name} finished")
        return self.wants if self.wants is not None else code

    def discard(self) -> None:
        self.calls.append(f"{self.name}.discard")


class Fake:
    """A feature as an extension writes one: a flag, and hooks that say when they ran."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--fake", action="store_true", help="A test feature.")

    def for_job(self, args: argparse.Namespace) -> FeatureJob | None:
        self.calls.append("for_job")
        return Recorder(self.calls, "fake") if args.fake else None


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    feature: LaunchFeature = Fake()
    features.register(feature)
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # main() may set it: keep it to this test
    yield feature
    features.unregister(feature)


def test_a_registered_feature_gets_its_flag_and_is_discarded_when_the_job_is_refused(
        fake: Fake, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    assert main(["--fake", "--dry-run", "--device", "cpu", str(script)]) == 0
    assert fake.calls == ["for_job"]  # a dry run prepares nothing
    fake.calls.clear()
    assert main(["--fake", "--device", "cpu", "--device-num", "0", str(script)]) == 2
    assert fake.calls == ["for_job", "fake.prepare", "fake.discard"]
    assert "--device-num 0 is not positive" in capsys.readouterr().err
    assert "--fake" in build_parser().format_help()


def test_hooks_run_in_order_and_a_feature_can_fail_a_job_that_succeeded() -> None:
    calls: list[str] = []
    said: list[str] = []
    jobs: list[FeatureJob] = [Recorder(calls, "a"), Recorder(calls, "b", wants=1)]
    features.prepare(jobs)
    assert features.finish(jobs, 0, said.append) == 1        # b's failure (a filter that matched nothing) ends the job 1
    assert features.finish(jobs, 3, said.append) == 3        # the job's own failure stands
    assert features.finish(jobs, None, said.append) is None  # the launcher failed: no feature turns that into a code
    assert calls == ["a.prepare", "b.prepare", "b.finish(0)", "a.finish(0)", "b.finish(3)", "a.finish(3)",
                     "b.finish(None)", "a.finish(None)"]
    assert said == ["b finished", "a finished"] * 3
    calls.clear()
    with pytest.raises(RuntimeError, match="prepare failed"):
        features.prepare([Recorder(calls, "a"), Recorder(calls, "b", fails=True), Recorder(calls, "c")])
    assert calls == ["a.prepare", "b.prepare", "a.discard"]


class Exporter(Recorder):
    """A job that exports a variable for the workers and says what it arms in a forked fork server."""

    def prepare(self) -> None:
        super().prepare()
        os.environ["NPU_MIGRATE_TEST_EXPORTED"] = self.name

    def in_fork_server(self) -> None:
        self.calls.append(f"{self.name}.in_fork_server")


def test_what_the_jobs_export_and_what_a_forked_fork_server_arms_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork server forked from the launcher runs every job's ``in_fork_server``; a job without one
    sends the fork server back to a new interpreter (None), whose start-up reads the environment."""
    monkeypatch.delenv("NPU_MIGRATE_TEST_EXPORTED", raising=False)
    calls: list[str] = []
    jobs: list[FeatureJob] = [Exporter(calls, "a"), Exporter(calls, "b")]
    assert features.prepare(jobs) == {"NPU_MIGRATE_TEST_EXPORTED"}
    arm = features.fork_server_arming(jobs)
    assert arm is not None
    arm()
    assert calls == ["a.prepare", "b.prepare", "a.in_fork_server", "b.in_fork_server"]
    assert features.prepare([]) == frozenset() and features.fork_server_arming([]) is not None
    assert features.fork_server_arming([*jobs, Recorder(calls, "c")]) is None
    assert all(callable(getattr(job, "in_fork_server", None)) for job in
               (feature.for_job(build_parser().parse_args(["--migrate", "--probe", "p", "--strict-ops", "--profile", "q",
                                                             "t.py"]))
                for feature in features.active()))


def test_builtin_features_keep_the_launcher_flags() -> None:
    args = build_parser().parse_args(["--migrate", "--migrate-report", "r.md", "--user-code", "src", "--probe", "p",
                                      "--probe-level", "modules", "train.py", "--k", "v"])
    assert (args.migrate, args.migrate_report, args.user_code, args.probe, args.probe_level) == (
        True, "r.md", ["src"], "p", "modules")
    assert args.script_args == ["--k", "v"]


@pytest.mark.slow
def test_a_refused_migration_leaves_no_report_directory(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    result = run_cli("launch", "--migrate", "--migrate-report", str(tmp_path / "r.md"), "--device", "cpu",
                     "--device-num", "100000", str(script), env=child_env(TMPDIR=str(temp)))
    assert result.returncode == 2, result.stderr
    assert "--device-num 100000 is more than" in result.stderr
    assert list(temp.glob("npu_migrate_report_*")) == []
