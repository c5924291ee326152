"""No secrets in what a run records: a real job with secrets planted in its argv and environment.

The job runs through the launcher on 2 CPU ranks with everything that records switched on: the
probe (``--probe``), runtime migration's report (``--migrate --migrate-report``) and the error
file (``--error-file``). Its command line carries secrets in every usual form (``--api-key X``,
``--wandb-api-key=X``, a database URL with a password, ``HF_TOKEN=X``), its environment has
``WANDB_API_KEY`` and a ``..._PASSWORD``, and rank 1 fails with a message that quotes several
of them. Then EVERY file the run wrote is read and searched for each secret.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env

SECRETS = {
    "argv --api-key X": "s3cr3t-argv-apikey-111",
    "argv --wandb-api-key=X": "s3cr3t-argv-wandb-222",
    "argv URL userinfo": "s3cr3t-db-pass-333",
    "argv HF_TOKEN=X": "s3cr3t-hf-token-444",
    "env WANDB_API_KEY": "s3cr3t-env-wandb-555",
    "env MY_SERVICE_PASSWORD": "s3cr3t-env-password-666",
}

SCRIPT = '''
import argparse, os, sys
import torch, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
import npu_migrate as nm

parser = argparse.ArgumentParser()
parser.add_argument("--api-key")
parser.add_argument("--wandb-api-key")
parser.add_argument("--db-url")
parser.add_argument("overrides", nargs="*")
args = parser.parse_args()
info = nm.init_distributed()
torch.manual_seed(0)
model = DDP(nn.Linear(4, 2).cuda())                  # CUDA calls: runtime migration records them
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):                                # the probe records two steps
    loss = model(torch.randn(3, 4).cuda()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
if info.rank == 1:
    raise RuntimeError(
        f"cannot log in to {args.db_url} with api_key={args.api_key} wandb_api_key={args.wandb_api_key}: "
        f"the server rejected {os.environ['WANDB_API_KEY']} and {os.environ['MY_SERVICE_PASSWORD']} "
        f"({' '.join(args.overrides)})")
'''


@pytest.mark.slow
def test_no_planted_secret_in_any_file_the_run_writes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--api-key", SECRETS["argv --api-key X"], f"--wandb-api-key={SECRETS['argv --wandb-api-key=X']}",
            "--db-url", f"postgres://trainer:{SECRETS['argv URL userinfo']}@db.example:5432/runs",
            f"HF_TOKEN={SECRETS['argv HF_TOKEN=X']}"]
    env = child_env(WANDB_API_KEY=SECRETS["env WANDB_API_KEY"],
                    MY_SERVICE_PASSWORD=SECRETS["env MY_SERVICE_PASSWORD"])
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate.launch", "--device-num", "2", "--migrate",
         "--migrate-report", str(out / "migrate.json"), "--error-file", str(out / "error.json"),
         "--probe", str(out / "probe"), str(script), *argv],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stderr

    written = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p != script)
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    assert {"out/migrate.json", "out/error.json", "out/probe/rank0.jsonl", "out/probe/rank1.jsonl"} <= names, names
    for path in written:
        data = path.read_bytes()
        leaked = [what for what, secret in SECRETS.items() if secret.encode() in data]
        assert not leaked, f"{path} holds {leaked}"

    # what was recorded is still useful: the argv's shape, the URL's host, the failure's gist
    header = json.loads((out / "probe" / "rank0.jsonl").read_text().splitlines()[0])
    assert header["argv"][1:] == ["--api-key", "***", "--wandb-api-key=***", "--db-url",
                                  "postgres://***@db.example:5432/runs", "HF_TOKEN=***"]
    error = json.loads((out / "error.json").read_text())
    failed = [r for r in error["ranks"] if r["rank"] == 1][0]
    assert failed["message"].startswith("cannot log in to postgres://***@db.example:5432/runs with api_key=***"), \
        failed["message"]
    assert json.loads((out / "migrate.json").read_text())["processes"] == 2
