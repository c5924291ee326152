"""torchrun's rendezvous flags: --rdzv-backend, --rdzv-endpoint, --rdzv-conf, node ranks from the rendezvous,
--nnodes MIN:MAX. Parsing is compared with torch's own parsers; the jobs are real launchers on loopback."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import free_port
from support import JOB, Launch, one_line_errors, wait_for_files, wait_for_text, wait_until

from npu_migrate.autoload import ENV_AUTOLOAD
from npu_migrate.launch.nodes import timing
from npu_migrate.launch.torchrun import rdzv as rdzv_flags
from npu_migrate.launch.cli import build_parser, main
from npu_migrate.launch.setup.config import make_config
from npu_migrate.launch.errors import LaunchUsageError
from npu_migrate.launch.setup.options import LaunchOptions

ENV = {"OMP_NUM_THREADS": "1"}
"""No scheduler in the environment make_config reads."""


# --------------------------------------------------------------------------- parsing, as torch parses


@pytest.mark.parametrize("text", ["1", "2", "1:4", "3:3", " 2 : 5 "])
def test_node_ranges_read_as_torchrun_reads_them(text: str) -> None:
    from torch.distributed.run import parse_min_max_nnodes

    assert rdzv_flags.node_range(text) == parse_min_max_nnodes(text)


@pytest.mark.parametrize("text", ["", "x", "1:2:3", "1.5", "0", "0:2", "2:1", "-1:2"])
def test_bad_node_ranges_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        rdzv_flags.node_range(text)


@pytest.mark.parametrize(("endpoint", "default"), [
    ("node1.example.com:29400", 29400), ("node1", 29400), ("10.0.0.1:1234", 29400), ("[::1]:29500", 29400),
    ("[fe80::1]", 29400), ("localhost:0", 29400), ("my-host_2", -1), ("10.0.0.1", -1),
])
def test_endpoints_read_as_torch_reads_them(endpoint: str, default: int) -> None:
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    assert rdzv_flags.parse_endpoint(endpoint, default) == parse_rendezvous_endpoint(endpoint, default)


@pytest.mark.parametrize("endpoint", ["host:port", "host:70000", "a b:1", "host:", "h/x:1"])
def test_malformed_endpoints_are_refused_as_torch_refuses_them(endpoint: str) -> None:
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    with pytest.raises(ValueError):
        parse_rendezvous_endpoint(endpoint, 29400)
    with pytest.raises(ValueError):
        rdzv_flags.parse_endpoint(endpoint, 29400)


@pytest.mark.parametrize("value", [*rdzv_flags.TRUE, *rdzv_flags.FALSE, "TRUE", "No"])
def test_rdzv_conf_booleans_are_torchs(value: str) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    params = RendezvousParameters("c10d", "h:1", "r", 1, 1, is_host=value)
    settled = rdzv_flags.settle("c10d", None, f"is_host={value}", None, None, None, None, None, 600.0)
    assert settled.rdzv.is_host == params.get_as_bool("is_host")


def test_rdzv_conf_keys_map_onto_the_launchers_windows() -> None:
    conf = "join_timeout=900, last_call_timeout=5,close_timeout=7,read_timeout=90,is_host=0,keep_alive_interval=2"
    settled = rdzv_flags.settle("c10d", "h:1", conf, 2, None, None, None, None, 600.0)
    assert settled.join_timeout == 900.0
    assert settled.rdzv == rdzv_flags.RdzvSettings(backend="c10d", assign=True, last_call_timeout=5.0,
                                                   close_timeout=7.0, read_timeout=90.0, is_host=False)
    assert timing.store_call_timeout(20.0, settled.rdzv.read_timeout) == 90.0
    assert timing.store_call_timeout(20.0) == timing.STORE_CALL_MIN_S
    # torchrun's `timeout` is its static rendezvous's wait; its c10d rendezvous ignores it.
    assert rdzv_flags.settle("static", None, "timeout=60", 2, None, 1, None, None, 600.0).join_timeout == 60.0
    assert rdzv_flags.settle("c10d", None, "timeout=60", 2, None, None, None, None, 600.0).join_timeout == 600.0


# --------------------------------------------------------------------------- what the flags set


def test_the_flags_reach_the_options_in_every_spelling() -> None:
    argv = ["--rdzv_backend", "c10d", "--rdzv_endpoint", "h:1", "--rdzv_conf", "join_timeout=9", "--rdzv_id", "J",
            "--nnodes", "1:4", "train.py"]
    options = LaunchOptions.from_args(build_parser().parse_args(argv))
    assert (options.rdzv_backend, options.rdzv_endpoint, options.rdzv_conf, options.job_id) == ("c10d", "h:1",
                                                                                                 "join_timeout=9", "J")
    assert (options.min_nodes, options.nnodes) == (1, 4)
    dashed = LaunchOptions.from_args(build_parser().parse_args(
        ["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-conf", "join_timeout=9", "--rdzv-id", "J",
         "--nnodes", "1:4", "train.py"]))
    assert dashed == options
    fixed = LaunchOptions.from_args(build_parser().parse_args(["--nnodes", "2:2", "train.py"]))
    assert (fixed.min_nodes, fixed.nnodes) == (None, 2)


def test_a_static_endpoint_is_master_addr_and_port() -> None:
    port = free_port()
    cfg = make_config(nproc=2, device="cpu", nnodes=2, node_rank=1, rdzv_backend="static",
                      rdzv_endpoint=f"127.0.0.1:{port}", environ=ENV)
    env = cfg.worker_env(1)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"], env["GROUP_RANK"]) == ("127.0.0.1", str(port), "3", "1")
    assert not cfg.rdzv.assign


def test_a_c10d_endpoint_without_a_port_takes_torchruns_and_ranks_wait_for_the_rendezvous() -> None:
    cfg = make_config(nproc=1, device="cpu", nnodes=2, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1", environ=ENV)
    assert (cfg.addr, cfg.port) == ("127.0.0.1", rdzv_flags.C10D_DEFAULT_PORT)
    assert cfg.rdzv.assign and cfg.node_rank == -1
    # With --node-rank, c10d keeps the node rank given; on one node there is nothing to assign.
    given = make_config(nproc=1, device="cpu", nnodes=2, node_rank=1, rdzv_backend="c10d",
                        rdzv_endpoint="127.0.0.1:29400", environ=ENV)
    assert not given.rdzv.assign and given.node_rank == 1
    single = make_config(nproc=1, device="cpu", rdzv_backend="c10d", rdzv_endpoint="localhost:0", environ=ENV)
    assert not single.rdzv.assign and single.node_rank == 0 and single.port > 0  # port 0: a free one


def test_a_schedulers_node_rank_gives_way_to_the_c10d_rendezvous() -> None:
    env = {**ENV, "SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "localhost",
           "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    cfg = make_config(nproc=1, device="cpu", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29400", environ=env)
    assert cfg.nnodes == 2 and cfg.rdzv.assign and cfg.node_rank == -1
    assert "node_rank" not in cfg.sources


def test_an_elastic_range_is_a_first_rendezvous_from_min_to_max() -> None:
    cfg = make_config(nproc=1, device="cpu", nnodes=4, min_nodes=2, rdzv_backend="c10d",
                      rdzv_endpoint="127.0.0.1:29400", environ=ENV)
    assert (cfg.rdzv.min_nodes, cfg.nnodes, cfg.rdzv.last_call_timeout) == (2, 4, rdzv_flags.DEFAULT_LAST_CALL_TIMEOUT)
    static = make_config(nproc=1, device="cpu", nnodes=4, min_nodes=2, node_rank=3, addr="127.0.0.1", port=29400,
                         environ=ENV)
    assert (static.rdzv.min_nodes, static.nnodes) == (None, 4)  # torchrun's static rendezvous waits for MAX


@pytest.mark.parametrize(("given", "message"), [
    ({"rdzv_backend": "etcd"}, r"^--rdzv-backend 'etcd' is not supported: expected c10d .* or static"),
    ({"rdzv_endpoint": "host:port"}, r"^--rdzv-endpoint 'host:port' is not HOST\[:PORT\]: its port 'port' is not"),
    ({"rdzv_conf": "join_timeout"}, r"^--rdzv-conf 'join_timeout': 'join_timeout' is not KEY=VALUE"),
    ({"rdzv_conf": "join_timout=5"}, r"^--rdzv-conf has an unknown key 'join_timout': expected some of join_timeout"),
    ({"rdzv_conf": "last_call_timeout=soon"}, r"last_call_timeout=soon: expected a positive number of seconds"),
    ({"rdzv_conf": "is_host=maybe"}, r"is_host=maybe: expected a boolean"),
    ({"rdzv_conf": "store_type=file"}, r"store_type=file: the launcher serves a TCP store only"),
    ({"rdzv_conf": "rank=1"}, r"give the node rank as --node-rank 1"),
    ({"nnodes": 2, "min_nodes": 3}, r"^--nnodes '3:2': MIN 3 is more than MAX 2"),
    ({"nnodes": 2, "min_nodes": 1, "node_rank": 1, "rdzv_backend": "c10d"}, r"leave --node-rank out on every node"),
    ({"addr": "10.0.0.2", "rdzv_endpoint": "10.0.0.1:29400"}, r"name different nodes"),
    ({"port": 29500, "rdzv_endpoint": "127.0.0.1:29400"}, r"name different ports"),
    ({"nnodes": 2, "rdzv_backend": "c10d", "rdzv_endpoint": "127.0.0.1:0"}, r"port 0 \(a free port\) works on one node"),
])
def test_bad_rendezvous_values_are_refused(given: dict, message: str) -> None:
    with pytest.raises(LaunchUsageError, match=message):
        make_config(nproc=1, device="cpu", **given, environ=ENV)


@pytest.mark.parametrize(("argv", "message"), [
    (["--rdzv-backend", "etcd-v2"], r"--rdzv-backend 'etcd-v2' is not supported"),
    (["--rdzv-endpoint", "node1:29400x"], r"--rdzv-endpoint 'node1:29400x' is not HOST\[:PORT\]: its port"),
    (["--rdzv-conf", "join_timeout=1,,x=2"], r"--rdzv-conf 'join_timeout=1,,x=2': '' is not KEY=VALUE"),
    (["--nnodes", "4:2"], r"argument --nnodes/--world-size/--world_size: '4:2': MIN 4 is more than MAX 2"),
    (["--nnodes", "a:b"], r"argument --nnodes.*'a:b' is not a node count N or a range MIN:MAX"),
])
def test_bad_rendezvous_flags_end_in_one_line_with_exit_2(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                         message: str) -> None:
    monkeypatch.setenv(ENV_AUTOLOAD, os.environ.get(ENV_AUTOLOAD, "0"))  # main() may set it: keep it to this test
    try:
        code = main(["--dry-run", "--device", "cpu", *argv, str(JOB)])
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and re.search(message, err), err


def test_dry_run_says_the_node_rank_comes_from_the_rendezvous(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_AUTOLOAD, os.environ.get(ENV_AUTOLOAD, "0"))
    assert main(["--dry-run", "--device", "cpu", "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-id", "J", str(JOB)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("world: 1 to 2 node(s) x 2 process(es) on cpu with gloo; master "
                                          "127.0.0.1:29400"), out
    assert "node rank: assigned at the c10d rendezvous (node 0 serves 127.0.0.1:29400); rank = node rank x 2 + " \
           "local rank" in out


# --------------------------------------------------------------------------- real launchers on loopback


def _node(tmp: Path, name: str, *flags: str, job: tuple[str, ...] = ()) -> Launch:
    return Launch(tmp, "--device", "cpu", "--node-timeout", "10", *flags, str(JOB), *job, name=name)


def _ranks(tmp: Path) -> dict[int, dict]:
    found = {}
    for path in tmp.glob("rank*.json"):
        report = json.loads(path.read_text())
        found[int(report["env"]["RANK"])] = report["env"]
    return found


def _check_world(tmp: Path, nnodes: int, nproc: int, port: int) -> None:
    """Every global rank once, with torchrun's rank = node rank x nproc + local rank."""
    ranks = _ranks(tmp)
    assert sorted(ranks) == list(range(nnodes * nproc)), ranks
    for rank, env in ranks.items():
        assert env["GROUP_RANK"] == env["NODE_RANK"] == str(rank // nproc), env
        assert env["LOCAL_RANK"] == str(rank % nproc) and env["WORLD_SIZE"] == str(nnodes * nproc), env
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(port)), env


@pytest.mark.slow
def test_torchruns_fault_tolerant_form_assigns_every_node_rank_once(tmp_path: Path) -> None:
    port = free_port()
    flags = ("--nnodes=2", "--nproc-per-node=2", "--max-restarts=3", "--rdzv-id=ftjob", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{port}")
    nodes = [_node(tmp_path, f"node{k}", *flags) for k in range(2)]
    for node in nodes:
        assert node.wait() == 0, node.err
        one_line_errors(node.err)
    _check_world(tmp_path, 2, 2, port)
    said = sorted(re.search(r"this is node (\d) of 2 \(node rank from the c10d rendezvous\)", n.err).group(1)
                  for n in nodes)
    assert said == ["0", "1"], [n.err for n in nodes]


@pytest.mark.slow
def test_a_static_rendezvous_takes_the_node_rank_given_and_the_endpoint_as_master(tmp_path: Path) -> None:
    port = free_port()
    nodes = [_node(tmp_path, f"node{k}", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "static",
                   "--rdzv_endpoint", f"127.0.0.1:{port}", "--node_rank", str(k)) for k in range(2)]
    for node in nodes:
        assert node.wait() == 0, node.err
    _check_world(tmp_path, 2, 1, port)
    assert "node 1 of 2:" in nodes[1].err


@pytest.mark.slow
def test_an_elastic_range_starts_with_min_nodes_after_the_last_call(tmp_path: Path) -> None:
    port = free_port()
    node = _node(tmp_path, "node0", "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "last_call_timeout=1")
    assert node.wait() == 0, node.err
    _check_world(tmp_path, 1, 2, port)
    assert "this is node 0 of 1 (node rank from the c10d rendezvous)" in node.err


@pytest.mark.slow
def test_an_elastic_range_closes_at_max_nodes(tmp_path: Path) -> None:
    port = free_port()
    # The last call outlasts any test: the rendezvous closes because MAX nodes came, not on a timer.
    flags = ("--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--rdzv-conf", "last_call_timeout=3600,join_timeout=300", "--rdzv-id", "elastic")
    release = tmp_path / "release"
    first = _node(tmp_path, "first", *flags, job=("--hold", str(release)))
    second = _node(tmp_path, "second", *flags, job=("--hold", str(release)))
    wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
    # The world is fixed now: a third launcher is refused, and the job goes on.
    late = _node(tmp_path, "late", *flags, job=("--hold", str(release)))
    try:
        assert late.wait() == 1, late.err
    finally:
        release.touch()
    last = late.err.strip().splitlines()[-1]
    assert last.startswith("npu-migrate launch: error: the rendezvous of job") and "closed with 2 node(s) before " \
        "this launcher came, and every node rank is held by a running launcher" in last, late.err
    one_line_errors(late.err)
    for node in (first, second):
        assert node.wait() == 0, node.err
    _check_world(tmp_path, 2, 1, port)


@pytest.mark.long
def test_a_relaunched_node_takes_the_lost_nodes_rank_from_the_rendezvous(tmp_path: Path) -> None:
    port = free_port()
    release = tmp_path / "release"
    flags = ("--nnodes=2", "--nproc-per-node=1", "--max-restarts=1", "--rdzv-id=relaunch", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{port}", "--node-timeout", "5")
    job = ("--hold", str(release))
    nodes = [_node(tmp_path, f"launcher{k}", *flags, job=job) for k in range(2)]
    wait_for_files(tmp_path, ["rank0.json", "rank1.json"])
    wait_until(lambda: all("nodes joined" in n.err for n in nodes), "both launchers say the nodes joined")
    node0, node1 = sorted(nodes, key=lambda n: "this is node 1 of 2" in n.err)
    assert "this is node 0 of 2" in node0.err and "this is node 1 of 2" in node1.err, [n.err for n in nodes]
    node1.proc.kill()
    node1.wait()
    wait_for_text(node0.stderr, "restarting the job (restart 1 of 1)")
    again = _node(tmp_path, "again", *flags, job=job)

    def restarted() -> bool:
        try:
            return all(env["TORCHELASTIC_RESTART_COUNT"] == "1" for env in _ranks(tmp_path).values()) \
                and len(_ranks(tmp_path)) == 2
        except (OSError, ValueError, KeyError):
            return False

    try:
        wait_until(restarted, "every rank restarted once")
    finally:
        release.touch()
    assert node0.wait() == 0, node0.err
    assert again.wait() == 0, again.err
    assert "this is node 1 of 2 (node rank from the c10d rendezvous)" in again.err, again.err
    assert "lost node 1" in node0.err, node0.err
    _check_world(tmp_path, 2, 1, port)
