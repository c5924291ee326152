"""torchrun's command line, flag by flag, in-process: every spelling accepted, each value's meaning, bad values refused.

torch's own parser (``torch.distributed.run.get_args_parser()``) is the list of flags: a flag torch
adds shows up here as a failure until the launcher takes it. The jobs that show what each flag does
to a real run are in test_launch_torchrun_jobs.py; torchrun's documented command lines in
test_launch_torchrun_docs.py.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
from pathlib import Path

import pytest

from conftest import LAUNCH_SCRIPTS
from npu_migrate.autoload import ENV_AUTOLOAD
from npu_migrate.launch.setup import cluster, ports
from npu_migrate.launch.torchrun import flags as torchrun_flags, logs as logs_layout
from npu_migrate.launch.cli import build_parser, main
from npu_migrate.launch.setup.config import LaunchConfig, make_config
from npu_migrate.launch.errors import LaunchUsageError
from npu_migrate.launch.torchrun.settings import DEFAULT_STOP_SIGNALS, Settings, nproc_family
from npu_migrate.launch.setup.options import LaunchOptions

SAMPLES = {
    "nnodes": "1", "nproc_per_node": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "127.0.0.1:29400",
    "rdzv_id": "job1", "rdzv_conf": "join_timeout=60", "max_restarts": "3", "monitor_interval": "0.5",
    "start_method": "fork", "event_log_handler": "console", "role": "trainer", "log_dir": "logs", "redirects": "3",
    "tee": "0:1,1:2", "log_line_prefix_template": "${hostname}:${rank}: ", "local_ranks_filter": "0,1",
    "duplicate_stdout_filters": "loss,,x,acc", "duplicate_stderr_filters": "Error", "node_rank": "0",
    "master_addr": "127.0.0.1", "master_port": "29500", "local_addr": "127.0.0.1", "logs_specs": "mine",
    "numa_binding": "socket", "signals_to_handle": "SIGTERM,SIGUSR1", "shutdown_timeout": "10",
    "enable_tiered_parallel_tcpstore": "true",
}
"""A value torchrun takes for each of its flags (by torchrun's dest)."""

EXITS = {"help", "print_completion"}
"""Flags that print and exit (tested on their own)."""

RENDEZVOUS = {"rdzv_backend", "rdzv_endpoint", "rdzv_conf"}
"""The rendezvous flags: the launcher's rendezvous part of issue 35 adds them (test_launch_rdzv.py)."""


def _skip_missing_rendezvous(action: argparse.Action) -> None:
    if action.dest in RENDEZVOUS and action.option_strings[0] not in build_parser()._option_string_actions:
        pytest.skip(f"{action.option_strings[0]} comes with the launcher's rendezvous flags")


def _torch_parser() -> argparse.ArgumentParser:
    from torch.distributed.run import get_args_parser

    return get_args_parser()


def _torch_flags() -> list[argparse.Action]:
    return [a for a in _torch_parser()._actions if a.option_strings and a.dest not in EXITS]


def _npu_run_flags() -> list[argparse.Action]:
    """torch_npu_run's own flag, as its release declares it (the flag's spellings below)."""
    parser = argparse.ArgumentParser()
    return [parser.add_argument("--enable_tiered_parallel_tcpstore", "--enable-tiered-parallel-tcpstore",
                                type=str, default="false")]


def _spellings(action: argparse.Action) -> list[list[str]]:
    """Every way torchrun takes ``action`` on its command line, before a script."""
    if action.nargs == 0:
        return [[option] for option in action.option_strings]
    value = SAMPLES[action.dest]
    forms = []
    for option in action.option_strings:
        forms += [[option, value], [f"{option}={value}"]]
        if not option.startswith("--"):
            forms.append([f"{option}{value}"])  # -r3
    return forms


def _parse(words: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args([*words, "train.py", "--own", "x"])
    assert (args.script, args.script_args) == ("train.py", ["--own", "x"]), words
    return args


def test_torch_lists_the_flags_this_test_knows() -> None:
    """Every flag of torch's parser has a sample value here (a new torch flag fails this first)."""
    missing = [a.dest for a in _torch_flags() if a.nargs != 0 and a.dest not in SAMPLES]
    assert missing == []


@pytest.mark.parametrize("action", [*_torch_flags(), *_npu_run_flags()], ids=lambda a: a.option_strings[-1])
def test_every_torchrun_flag_is_taken_in_every_spelling(action: argparse.Action) -> None:
    _skip_missing_rendezvous(action)
    forms = _spellings(action)
    parsed = [vars(_parse(words)) for words in forms]
    assert all(p == parsed[0] for p in parsed), forms  # one meaning, however it is spelt
    assert parsed[0] != vars(_parse([])), forms  # and it is read, not dropped


def test_every_torchrun_flag_says_what_it_does_here() -> None:
    ours = build_parser()._option_string_actions
    for action in [*_torch_flags(), *_npu_run_flags()]:
        if action.dest in RENDEZVOUS and action.option_strings[0] not in ours:
            continue  # the launcher's rendezvous flags (test_every_torchrun_flag_is_taken_in_every_spelling skips)
        for option in action.option_strings:
            assert option in ours and len(ours[option].help or "") > 20, option


def test_numa_binding_and_start_method_take_torchruns_values() -> None:
    torch_choices = {a.dest: tuple(a.choices) for a in _torch_flags() if a.choices}
    assert torch_choices["start_method"] == torchrun_flags.START_METHODS
    if "numa_binding" in torch_choices:  # torch >= 2.9
        assert torch_choices["numa_binding"] == torchrun_flags.NUMA_BINDINGS


def test_stream_values_are_torchs() -> None:
    from torch.distributed.elastic.multiprocessing.api import Std, to_map

    for spec in ("0", "1", "2", "3", "0:1", "0:3,1:0,2:1,3:2", "1:2,0:1"):
        assert logs_layout.std_map(spec, 4) == {k: int(v) for k, v in to_map(Std.from_str(spec), 4).items()}
    for bad in ("4", "a", "0:4", "10:1", "0:1,", "3,0:1", ""):
        with pytest.raises(ValueError):
            Std.from_str(bad)
        with pytest.raises(ValueError):
            logs_layout.std_spec(bad)


def test_duplicate_filters_split_as_torchrun_splits_them() -> None:
    args = _parse(["--duplicate-stdout-filters", "loss,,x,acc", "--duplicate_stderr_filters", "Error"])
    assert (args.stdout_filters, args.stderr_filters) == (("loss,x", "acc"), ("Error",))


# --------------------------------------------------------------------------- --tee: torchrun's value and the switch


@pytest.mark.parametrize("words,tee", [
    (["--tee", "3"], "3"), (["-t", "0:1,1:2"], "0:1,1:2"), (["--tee=2"], "2"), (["-t1"], "1"),
    (["--log-dir", "logs", "--tee"], True), (["--tee", "--log-dir", "logs"], True),
])
def test_tee_takes_torchruns_value_or_is_the_launchers_switch(words: list[str], tee: object) -> None:
    assert _parse(words).tee == tee


def test_tee_before_the_script_is_the_switch_and_the_scripts_own_tee_stays_its_own() -> None:
    args = build_parser().parse_args(["--log-dir", "logs", "--tee", "train.py", "--tee", "x", "--epochs", "3"])
    assert (args.tee, args.script, args.script_args) == (True, "train.py", ["--tee", "x", "--epochs", "3"])


# --------------------------------------------------------------------------- refused in one line


@pytest.mark.parametrize("args,message", [
    (["--tee", "5"], r"argument -t/--tee: '5' is not a stream value: expected 0 \(none\), 1 \(stdout\)"),
    (["--tee=out"], r"argument -t/--tee: 'out' is not a stream value"),
    (["-r", "0:4"], r"argument -r/--redirects: '0:4' is not a stream value"),
    (["--nproc-per-node", "cuda"], r"'cuda' is not a process count: expected a number or one of auto, cpu, gpu"),
    (["--signals-to-handle", "SIGTERM,SIGFOO"], r"'SIGFOO' is not a signal name"),
    (["--signals-to-handle", "SIGKILL"], r"SIGKILL cannot be handled by any process"),
    (["--shutdown-timeout", "-1"], r"'-1' is negative"),
    (["--shutdown-timeout", "2.5"], r"'2.5' is not a number of seconds"),
    (["--monitor-interval", "x"], r"'x' is not a number of seconds"),
    (["--numa-binding", "cpu"], r"argument --numa-binding/--numa_binding: invalid choice: 'cpu'"),
    (["--start-method", "thread"], r"invalid choice: 'thread'"),
    (["--enable_tiered_parallel_tcpstore", "yes"], r"'yes' is not true or false"),
    (["--no-python", "-m"], r"don't use both the '--no-python' flag and the '--module' flag at the same time"),
    (["--standalone", "--nnodes", "2"], r"--standalone is one node on this host, but --nnodes 2 asks for more"),
    (["--nproc-per-node", "xpu"], r"--nproc-per-node xpu: the launcher runs the npu, cuda and cpu device families"),
    (["--nproc-per-node", "gpu"], r"--nproc-per-node gpu: No cuda device is visible"),
    (["--nproc-per-node", "gpu", "--device", "cpu"], r"--nproc-per-node gpu counts cuda devices, but --device is cpu"),
    (["--logs-specs", "nosuch", "--tee", "3"],
     r"--logs-specs 'nosuch': could not find entrypoint under 'torchrun.logs_specs\[nosuch\]' key"),
    (["--event-log-handler", "nosuch"], r"--event-log-handler 'nosuch' is not a registered event handler"),
    (["--local-addr", "no-such-host.invalid"], r"--local-addr 'no-such-host.invalid' does not resolve"),
    (["--tee", "3", "--log-dir", "logs", "--log-append"], r"--log-append is for --log-dir's rank\{N\}.log files"),
    (["--tee", "--log-dir", "logs", "-r", "3"], r"--tee without a value .* does not go with torchrun's --redirects"),
    (["--no-python", "{script}"], r"--no-python: '.*output_job.py' is not executable: `chmod \+x"),
])
def test_values_torchrun_refuses_are_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str],
        message: str) -> None:
    monkeypatch.setenv(ENV_AUTOLOAD, os.environ.get(ENV_AUTOLOAD, "0"))  # main() may set it: keep it to this test
    monkeypatch.chdir(tmp_path)
    script = str(LAUNCH_SCRIPTS / "output_job.py")
    argv = [a.replace("{script}", script) for a in args]
    try:
        code = main(argv if script in argv else [*argv, script])
    except SystemExit as exc:  # argparse's own line
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err


def test_standalone_refuses_a_node_range(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        args = build_parser().parse_args(["--standalone", "--nnodes", "1:2", "train.py"])
    except SystemExit:
        pytest.skip("--nnodes MIN:MAX comes with the launcher's rendezvous flags")
    with pytest.raises(LaunchUsageError, match=r"--standalone is one node on this host, but --nnodes 1:2 asks for more"):
        torchrun_flags.apply(args)


# --------------------------------------------------------------------------- what each value means


def _config(tmp_path: Path, **given: object) -> LaunchConfig:
    cfg = make_config(LaunchOptions.build(device="cpu", **given), environ={"OMP_NUM_THREADS": "1"})
    ports.release(cfg.port)
    return cfg


def test_nproc_words_count_as_torchrun_counts(tmp_path: Path) -> None:
    cores = cluster.node_cores()
    assert _config(tmp_path, nproc="auto").nproc == cores  # no accelerator: the CPUs, as torchrun's auto
    assert _config(tmp_path, nproc="cpu").nproc == cores
    assert _config(tmp_path, nproc=3).nproc == 3


def test_standalone_is_this_host_alone_whatever_a_scheduler_says() -> None:
    slurm = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "node[1-4]",
             "OMP_NUM_THREADS": "1"}
    args = _parse(["--standalone", "--rdzv-id", "mine", "--master-port", "1234", "--nproc-per-node", "2"])
    torchrun_flags.apply(args)
    cfg = make_config(LaunchOptions.from_args(args), environ=slurm)
    ports.release(cfg.port)
    assert (cfg.nnodes, cfg.node_rank, cfg.addr) == (1, 0, "127.0.0.1")
    assert cfg.port != 1234 and re.fullmatch(r"[0-9a-f-]{36}", cfg.job_id)  # a free port, a new uuid: torchrun's


def test_the_workers_get_torchruns_variables() -> None:
    """The variables torch's LocalElasticAgent._start_workers gives each worker, read from torch's source."""
    import inspect

    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    source = inspect.getsource(LocalElasticAgent._start_workers)
    torchs = set(re.findall(r'"([A-Z][A-Z0-9_]+)":', source.split("worker_env = {", 1)[1].split("}", 1)[0]))
    assert {"RANK", "ROLE_NAME", "TORCHELASTIC_RUN_ID"} <= torchs
    cfg = LaunchConfig(nproc=2, nnodes=2, node_rank=1, torchrun=Settings(role="trainer"), error_files=("/e0", "/e1"))
    env = cfg.worker_env(1, restart_count=1)
    # TORCHELASTIC_USE_AGENT_STORE is the worker's own (it connects to node 0's store: npu_migrate.launch.nodes.servers).
    assert torchs - {"TORCHELASTIC_USE_AGENT_STORE"} <= set(env)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE",
                                "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RESTART_COUNT")} == {
        "RANK": "3", "LOCAL_RANK": "1", "ROLE_NAME": "trainer", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
        "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_ERROR_FILE": "/e1", "TORCHELASTIC_RESTART_COUNT": "1"}
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_the_workers_get_what_torchruns_agent_exports_from_its_own_environment() -> None:
    """torch's launch_agent sets variables in its own environment, which every worker inherits
    (TORCHELASTIC_SIGNALS_TO_HANDLE since torch 2.8), read from torch's source."""
    import inspect

    from torch.distributed.launcher import api

    exported = set(re.findall(r'os\.environ\["([A-Z][A-Z0-9_]+)"\] =', inspect.getsource(api.launch_agent)))
    env = LaunchConfig(nproc=2).worker_env(0)
    assert exported <= set(env)
    assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's default
    named = LaunchConfig(nproc=2, torchrun=Settings(stop_signals=(signal.SIGTERM, signal.SIGUSR1))).worker_env(1)
    assert named["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGUSR1"  # names torch's agent can read back


def test_virtual_local_rank_is_local_rank_0_and_one_visible_device() -> None:
    cfg = LaunchConfig(nproc=2, torchrun=Settings(virtual_local_rank=True))
    assert [(e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in map(cfg.worker_env, (0, 1))] == [("0", "0"), ("0", "1")]
    masked = Settings(virtual_local_rank=True, visible=("4", "6"))  # mapped through the parent's mask
    assert [masked.env(local)["CUDA_VISIBLE_DEVICES"] for local in (0, 1)] == ["4", "6"]
    assert masked.device_index(1) == 0 and Settings().device_index(1) == 1


def test_nproc_words_pick_the_family_they_count() -> None:
    assert [nproc_family(w, None) for w in ("gpu", "npu", "cpu", "auto", None)] == ["cuda", "npu", "cpu", None, None]
    assert nproc_family("auto", "npu") == "npu" and nproc_family("npu", "auto") == "npu"


def test_signals_to_handle_and_their_defaults() -> None:
    assert _parse(["--signals-to-handle", "SIGTERM, usr1,SIGUSR2"]).signals_to_handle == (
        signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    assert DEFAULT_STOP_SIGNALS == tuple(getattr(signal, n) for n in torchrun_flags.DEFAULT_SIGNALS)
    torch_default = [a.default for a in _torch_flags() if a.dest == "signals_to_handle"]  # torch >= 2.8
    assert torch_default in ([], [",".join(torchrun_flags.DEFAULT_SIGNALS)])


def test_torchruns_variables_stand_in_for_left_out_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(torchrun_flags.PREFIX_TEMPLATE_ENV, "${hostname}|")
    monkeypatch.setenv(torchrun_flags.SHUTDOWN_TIMEOUT_ENV, "12")
    args = _parse([])
    torchrun_flags.apply(args)
    assert (args.prefix_template, args.shutdown_timeout) == ("${hostname}|", 12)
    given = _parse(["--log-line-prefix-template", "", "--shutdown-timeout", "1"])
    torchrun_flags.apply(given)
    assert (given.prefix_template, given.shutdown_timeout) == ("", 1)  # the flags win


# --------------------------------------------------------------------------- torchrun's log layout


def test_the_layout_is_torchs_default_logs_specs(tmp_path: Path) -> None:
    """Layout (for a torch without LogsSpecs) writes exactly what torch's DefaultLogsSpecs writes."""
    api = pytest.importorskip("torch.distributed.elastic.multiprocessing.api")
    if not hasattr(api, "DefaultLogsSpecs"):
        pytest.skip("this torch has no DefaultLogsSpecs (torch < 2.3): Layout is the layout")
    DefaultLogsSpecs, LogsDest, Std = api.DefaultLogsSpecs, api.LogsDest, api.Std
    filtered = "filtered_stdout" in LogsDest.__dataclass_fields__  # newer torch; before, Layout's own files

    def tree(specs: object, root: Path) -> tuple[list[str], dict]:
        envs = {local: {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "1"} for local in range(3)}
        dest = logs_layout.destinations(specs, envs)
        rel = lambda p: re.sub(r"job_[^/]+", "job_X", os.path.relpath(p, root)) if p else p  # noqa: E731
        shown = {"out": [(rel(s.file), s.console) for s in dest.out], "err": [(rel(s.file), s.console) for s in dest.err],
                 "errors": [rel(e) for e in dest.error_files], "filtered": rel(dest.filtered_stdout) if filtered else "",
                 "env": [rel(e["TORCHELASTIC_ERROR_FILE"]) for e in envs.values()]}
        return sorted(re.sub(r"job_[^/]+", "job_X", os.path.relpath(p, root)) for p in map(str, root.rglob("*"))), shown

    theirs = DefaultLogsSpecs(log_dir=str(tmp_path / "a"), redirects=Std.from_str("0:1,2:3"),
                              tee=Std.from_str("1:2,2:1"), local_ranks_filter={0, 1})
    ours = logs_layout.Layout(log_dir=str(tmp_path / "b"), redirects={0: 1, 2: 3}, tee={1: 2, 2: 1},
                              local_ranks_filter={0, 1})
    assert tree(ours, tmp_path / "b") == tree(theirs, tmp_path / "a")


def test_the_layout_is_torchs_where_torch_has_one() -> None:
    """torch's DefaultLogsSpecs where it has the duplicate filters' files; Layout before (torch < 2.3 has none)."""
    from torch.distributed.elastic.multiprocessing import api

    dest = getattr(api, "LogsDest", None)
    if dest is not None and "filtered_stdout" in dest.__dataclass_fields__:
        assert logs_layout.specs_class(None) is api.DefaultLogsSpecs
    else:
        assert logs_layout.specs_class(None) is logs_layout.Layout


def test_torchrun_flags_pick_torchruns_layout() -> None:
    assert not logs_layout.TorchrunLogs().active and not logs_layout.TorchrunLogs(redirects="0:0,1:0").active
    assert logs_layout.TorchrunLogs(tee="1:2").active and logs_layout.TorchrunLogs(stdout_filters=("x",)).active
    assert logs_layout.TorchrunLogs(specs="mine").active


def test_parse_errors_name_the_flag_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--redirects", "x", "train.py"])
    assert info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_print_completion_needs_shtab_as_torchrun_says(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import shtab  # noqa: F401
    except ImportError:
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(["--print-completion", "zsh"])
        assert info.value.code == 1
        assert capsys.readouterr().err == "--print-completion requires the 'shtab' package: pip install shtab\n"
    else:
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(["--print_completion", "bash"])
        assert info.value.code in (0, None) and "--nproc-per-node" in capsys.readouterr().out
