"""Each rank leads its own session, as torchrun's workers do, and never touches the terminal.

The launcher runs as a terminal's foreground job (a pseudo-terminal it controls, as a shell gives one).
Ctrl-C on that terminal reaches the launcher, which stops the ranks; a rank has no controlling
terminal and no terminal on its stdin, so it can neither be stopped by SIGTTIN/SIGTTOU (a background
process group that reads or configures the terminal is), nor take the user's keystrokes; and the
launcher kills a rank's whole group, grandchildren included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import LAUNCH_SCRIPTS, ROOT, child_env
from support import HANG_GUARD_S, assert_all_gone, one_line_errors, wait_for_files

SCRIPT = LAUNCH_SCRIPTS / "session_job.py"

# A session leader that makes the pseudo-terminal on its stdin its controlling terminal, then becomes
# the launcher: the launcher is the terminal's foreground job, as when a user types the command.
_ON_A_TERMINAL = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                  "os.execv(sys.executable, [sys.executable, '-m', 'npu_migrate.launch', *sys.argv[1:]])")


def test_ranks_lead_their_own_sessions_and_ctrl_c_reaches_the_launcher(tmp_path: Path) -> None:
    master, slave = os.openpty()
    try:
        with (tmp_path / "launch.err").open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", _ON_A_TERMINAL, "--device-num", "2", str(SCRIPT), str(tmp_path / "never")],
                env=child_env(OUT_DIR=str(tmp_path)), cwd=ROOT, stdin=slave, stdout=err, stderr=err,
                start_new_session=True,
            )
        os.close(slave)
        try:
            wait_for_files(tmp_path, ["session0.json", "session1.json"])
            seen = [json.loads((tmp_path / f"session{r}.json").read_text()) for r in (0, 1)]
            os.write(master, b"\x03")  # Ctrl-C, typed on the launcher's terminal
            code = proc.wait(timeout=HANG_GUARD_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        os.close(master)
    text = (tmp_path / "launch.err").read_text()
    for rank, got in enumerate(seen):
        assert got["sid"] == got["pgid"] == got["pid"], (rank, got)  # its own session, led by the rank  # its own session, led by the rank
        assert got["parent_sid"] != got["sid"], (rank, got)  # not the launcher's session
        assert got["dev_tty"] == os.strerror(6), (rank, got)  # ENXIO: no controlling terminal
        assert got["stdin_is_tty"] is False, (rank, got)  # the terminal is not on its stdin either
        assert got["grandchild_pgid"] == got["pid"], (rank, got)  # what a rank starts is in its group
    assert code == 130, text  # SIGINT reached the launcher (the foreground job), which stopped the ranks
    one_line_errors(text)
    assert "received SIGINT" in text.strip().splitlines()[-1], text
    assert_all_gone([pid for got in seen for pid in (got["pid"], got["grandchild"])])
