""".ci/commit_messages.py on real git repositories: each bad commit named in one line, exit 1; a clone
without the base commit checks what it has and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

CHECK = ROOT / ".ci" / "commit_messages.py"
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], env={**os.environ, **GIT_ENV}, capture_output=True,
                          text=True, check=True).stdout.strip()


def commit(repo: Path, message: str) -> str:
    """A commit with this exact message; its hash."""
    git(repo, "commit", "--allow-empty", "--cleanup=verbatim", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def check(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), *args], cwd=repo, env={**os.environ, **GIT_ENV},
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, "x" * 100)  # before the rule: never checked
    return repo


def test_a_good_history_passes(repo: Path) -> None:
    base = commit(repo, "area: a subject\n\nThe body says what and why.\n")
    commit(repo, "area: " + "y" * 66)  # exactly 72, no body
    result = check(repo, "--base", base)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert "all 2 follow the rule" in result.stdout


def test_each_bad_commit_is_named_in_one_line(repo: Path) -> None:
    base = commit(repo, "area: the first commit under the rule\n")
    long = commit(repo, "area: " + "z" * 67 + "\n\nA body.\n")  # 73 characters
    glued = commit(repo, "area: a subject\nand its body on the next line\n")
    commit(repo, "area: a good one\n\nA body.\n")
    result = check(repo, "--base", base[:7])
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"{long[:12]} subject of 73 characters (at most 72): area: {'z' * 66}",
        f"{glued[:12]} no blank line between the subject and the body: area: a subject",
    ]
    assert f"checked {base[:7]} and the commits after it: 2 of 4 break the rule" in result.stdout


def test_a_shallow_clone_without_the_base_checks_what_it_has_and_says_so(repo: Path, tmp_path: Path) -> None:
    base = commit(repo, "area: the first commit under the rule\n")
    commit(repo, "area: one more\n")
    bad = commit(repo, "area: " + "w" * 80)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--depth", "2", f"file://{repo}", str(clone))
    result = check(clone, "--base", base)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"{bad[:12]} subject of 86 characters (at most 72): area: {'w' * 66}"]
    assert f"every commit there is, as base {base} is missing (this clone is shallow): 1 of 2" in result.stdout


def test_outside_a_repository_nothing_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # whatever holds the temporary folder
    result = check(tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == "commit messages: not a git repository, nothing checked"
