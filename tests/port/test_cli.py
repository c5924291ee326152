"""``npu-migrate port`` and ``check`` end to end on a tmp_path tree, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from npu_migrate.cli import main

CUDA = "import torch\n\nx = torch.zeros(2).cuda()  # to the GPU\n"
PORTED = "import torch\nimport npu_migrate as nm\n\nx = torch.zeros(2).to(nm.device_type())  # to the GPU\n"
BROKEN = "import torch\nx = torch.zeros(2).cuda(\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "pkg" / "data").mkdir(parents=True)
    (src / "train.py").write_text(CUDA)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "model.py").write_text("import torch\n\nclass M(torch.nn.Module):\n    pass\n")
    (src / "pkg" / "broken.py").write_text(BROKEN)
    (src / "pkg" / "data" / "config.yaml").write_text("lr: 0.1\n")
    (src / "README.md").write_text("# demo\n")
    (src / "run.sh").write_bytes(b"#!/bin/sh\npython train.py\n")
    (src / "run.sh").chmod(0o755)
    return src


class _Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run the CLI in this process (fast); test_out_mirrors_the_tree_and_reports runs it as a user would."""

    def run(*args: str) -> _Result:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return _Result(code, out, err)

    return run


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_out_mirrors_the_tree_and_reports(tree: Path, tmp_path: Path) -> None:
    before = _snapshot(tree)
    out = tmp_path / "out"
    report, data = tmp_path / "port.md", tmp_path / "port.json"
    result = run_cli("port", str(tree), "--out", str(out), "--report", str(report), "--json", str(data))
    assert result.returncode == 1, result.stderr  # pkg/broken.py failed
    assert _snapshot(tree) == before  # the input is never modified
    mirrored = _snapshot(out)
    assert set(mirrored) == set(before)
    assert mirrored["train.py"] == PORTED.encode()
    for name in ("pkg/model.py", "pkg/broken.py", "pkg/data/config.yaml", "README.md", "run.sh"):
        assert mirrored[name] == before[name], name
    assert (out / "run.sh").stat().st_mode & 0o111
    err = result.stderr.strip().splitlines()
    assert f"npu-migrate port: error: {tree}/pkg/broken.py: does not parse: line 2" in err[0]
    assert err[0].endswith("(copied unchanged)")
    assert "Traceback" not in result.stderr
    assert "1 changed, 2 unchanged, 1 failed" in err[-1]
    assert "| 3:5 | NM001 | `torch.zeros(2).cuda()` | `torch.zeros(2).to(nm.device_type())` |" in report.read_text()
    totals = json.loads(data.read_text())["totals"]
    assert (totals["changed"], totals["failed"], totals["copied"]) == (1, 1, 3)


def test_out_with_two_jobs_gives_the_same_tree(tree: Path, tmp_path: Path, cli) -> None:
    (tree / "pkg" / "broken.py").unlink()
    for i in range(4):
        (tree / "pkg" / f"extra{i}.py").write_text(CUDA)
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli("port", str(tree), "--out", str(one)).returncode == 0
    result = cli("port", str(tree), "--out", str(two), "-j", "2")
    assert result.returncode == 0, result.stderr
    assert _snapshot(one) == _snapshot(two)
    assert _snapshot(two)["pkg/extra3.py"] == PORTED.encode()


def test_without_out_nothing_is_written_and_the_diff_is_printed(tree: Path, cli) -> None:
    before = _snapshot(tree)
    result = cli("port", str(tree / "train.py"))
    assert result.returncode == 0, result.stderr
    assert _snapshot(tree) == before
    assert f"--- a/{tree}/train.py" in result.stdout
    assert "-x = torch.zeros(2).cuda()  # to the GPU" in result.stdout
    assert "+x = torch.zeros(2).to(nm.device_type())  # to the GPU" in result.stdout
    assert "dry run: nothing written" in result.stderr


def test_in_place_keeps_backups_and_refuses_to_overwrite_them(tree: Path, cli) -> None:
    (tree / "pkg" / "broken.py").unlink()
    model_before = (tree / "pkg" / "model.py").read_bytes()
    result = cli("port", str(tree), "--in-place")
    assert result.returncode == 0, result.stderr
    assert (tree / "train.py").read_text() == PORTED
    assert (tree / "train.py.orig").read_text() == CUDA
    assert (tree / "pkg" / "model.py").read_bytes() == model_before
    assert not (tree / "pkg" / "model.py.orig").exists()  # unchanged files get no backup
    # Porting ported code changes nothing, so a second run needs no backup.
    assert cli("port", str(tree), "--in-place").returncode == 0
    assert (tree / "train.py").read_text() == PORTED
    # A changed file whose backup exists: nothing is written at all.
    (tree / "other.py").write_text(CUDA)
    (tree / "other.py.orig").write_text("keep me\n")
    result = cli("port", str(tree), "--in-place")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Backup" in result.stderr and "other.py.orig already exists" in result.stderr
    assert (tree / "other.py").read_text() == CUDA
    assert (tree / "other.py.orig").read_text() == "keep me\n"


def test_check_prints_one_finding_per_line_and_exits_1(tree: Path, cli) -> None:
    (tree / "pkg" / "broken.py").unlink()
    (tree / "pkg" / "dp.py").write_text("import torch\nm = torch.nn.DataParallel(m)\n")
    result = cli("check", str(tree))
    assert result.returncode == 1, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines == [
        f"{tree}/train.py:3:5 NM001 torch.zeros(2).cuda() -> torch.zeros(2).to(nm.device_type())",
        f"{tree}/pkg/dp.py:2:5 NM108 torch.nn.DataParallel is single-process multi-device, which Ascend does not support",
    ]


def test_check_on_ported_code_is_clean(tree: Path, tmp_path: Path, cli) -> None:
    (tree / "pkg" / "broken.py").unlink()
    out = tmp_path / "out"
    assert cli("port", str(tree), "--out", str(out)).returncode == 0
    result = cli("check", str(out))
    assert (result.returncode, result.stdout) == (0, "")


def test_check_counts_a_broken_file(tree: Path, cli) -> None:
    result = cli("check", str(tree / "pkg"))
    assert result.returncode == 1
    assert "broken.py: does not parse" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (("port", "missing_dir"), "missing_dir: no such file or directory"),
    (("port", "{tree}", "--select", "NM999"), "Unknown rule code 'NM999' in --select"),
    (("port", "{tree}", "--out", "{tree}/sub"), "is inside the input"),
    (("port", "{tree}", "-j", "0"), "-j 0: expected a number of processes of at least 1"),
    (("port",), "No PATH given"),
])
def test_usage_errors_exit_2_in_one_line(tree: Path, args: tuple[str, ...], needle: str, cli) -> None:
    result = cli(*(a.format(tree=tree) for a in args))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr, result.stderr


def test_out_and_in_place_exclude_each_other(tree: Path, tmp_path: Path, cli) -> None:
    result = cli("port", str(tree), "--in-place", "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "not allowed with argument" in result.stderr


def test_list_rules(tmp_path: Path, cli) -> None:
    result = cli("port", "--list-rules")
    assert result.returncode == 0
    assert result.stdout.startswith("NM001  rewrite  cuda-method")
    assert "NM113  report" in result.stdout


# --------------------------------------------------------------------------- large and strange files


def test_non_python_files_are_streamed_never_read(tree: Path, tmp_path: Path, cli, monkeypatch) -> None:
    """A checkpoint in the tree is copied by streaming: port never reads a non-Python file whole."""
    (tree / "ckpt.pt").write_bytes(b"\x80" * (1 << 20))
    real = Path.read_bytes

    def guarded(self: Path) -> bytes:
        assert self.suffix in (".py", ".ipynb"), f"{self} was read whole"
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", guarded)
    (tree / "pkg" / "broken.py").unlink()
    out = tmp_path / "out"
    assert cli("port", str(tree), "--out", str(out)).returncode == 0
    monkeypatch.undo()
    assert (out / "ckpt.pt").read_bytes() == (tree / "ckpt.pt").read_bytes()


def test_binary_and_undecodable_python_files_are_reported_and_copied(tree: Path, tmp_path: Path, cli) -> None:
    (tree / "pkg" / "broken.py").unlink()
    (tree / "blob.py").write_bytes(b"\x7fELF\x00\x01\x02 cuda")
    (tree / "latin.py").write_bytes(b"# -*- coding: utf-8 -*-\nx = '\xff cuda'\n")
    out = tmp_path / "out"
    result = cli("port", str(tree), "--out", str(out))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert errors == [
        f"npu-migrate port: error: {tree}/blob.py: binary file (contains NUL bytes) (copied unchanged)",
        f"npu-migrate port: error: {tree}/latin.py: cannot decode: 'utf-8' codec can't decode byte 0xff in position "
        "29: invalid start byte (copied unchanged)",
    ]
    for name in ("blob.py", "latin.py"):
        assert (out / name).read_bytes() == (tree / name).read_bytes()
    assert "nm.device_type()" in (out / "train.py").read_text()  # the rest went on


def test_symlink_loops_and_dangling_links_get_one_line_each(tree: Path, tmp_path: Path, cli) -> None:
    (tree / "pkg" / "broken.py").unlink()
    (tree / "loop_a.py").symlink_to(tree / "loop_b.py")
    (tree / "loop_b.py").symlink_to(tree / "loop_a.py")
    (tree / "gone.py").symlink_to(tree / "missing.py")
    (tree / "pkg" / "up").symlink_to(tree, target_is_directory=True)  # a directory loop is not followed
    out = tmp_path / "out"
    result = cli("port", str(tree), "--out", str(out))
    assert result.returncode == 1
    errors = sorted(line for line in result.stderr.splitlines() if ": error: " in line)
    assert errors == [
        f"npu-migrate port: error: {tree}/gone.py: cannot read: No such file or directory",
        f"npu-migrate port: error: {tree}/loop_a.py: cannot read: Too many levels of symbolic links",
        f"npu-migrate port: error: {tree}/loop_b.py: cannot read: Too many levels of symbolic links",
    ]
    assert "Traceback" not in result.stderr
    assert "nm.device_type()" in (out / "train.py").read_text()


def test_several_inputs_keep_their_names_at_the_top_of_out(tree: Path, tmp_path: Path, cli) -> None:
    """Files stay files (``train.py utils.py --out p/`` gives ``p/train.py``, ``p/utils.py``, so a ported
    script still imports its neighbour); a folder among them keeps its name as a folder."""
    (tree / "pkg" / "broken.py").unlink()
    (tree / "utils.py").write_text(CUDA)
    out = tmp_path / "p"
    result = cli("port", str(tree / "train.py"), str(tree / "utils.py"), str(tree / "pkg"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    got = _snapshot(out)
    assert got["train.py"] == got["utils.py"] == PORTED.encode()
    assert "pkg/model.py" in got and "pkg/data/config.yaml" in got, sorted(got)
    assert not any(name.startswith(("train.py/", "utils.py/")) for name in got), sorted(got)
