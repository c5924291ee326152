"""Every commit since the rule began has a readable message: a subject of at most 72 characters and,
where there is a body, a blank line between the two (CONTRIBUTING.md says why).

    python .ci/commit_messages.py [--base COMMIT] [--head REV]

checks BASE and every commit after it up to HEAD (BASE is the first commit written under the rule).
On a shallow or partial clone without BASE it checks the commits there are and says so; outside a
git repository it checks nothing and says so. Each bad commit is one line, ``<hash> <what is wrong>:
<subject>``; the exit code is 1 if there is one, else 0. Standard library only; git is run without a
shell.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

BASE = "5a4f84d"
"""The first commit whose message follows the rule; the commits before it are left as they are."""

MAX_SUBJECT = 72


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False)


def problem(message: str) -> str | None:
    """What is wrong with one commit message, or None."""
    lines = message.rstrip("\n").split("\n")
    subject = lines[0]
    if not subject.strip():
        return "empty subject"
    if len(subject) > MAX_SUBJECT:
        return f"subject of {len(subject)} characters (at most {MAX_SUBJECT})"
    if len(lines) > 1 and lines[1].strip():
        return "no blank line between the subject and the body"
    return None


def messages(base: str, head: str) -> tuple[list[tuple[str, str]], str]:
    """``(hash, message)`` of each commit to check, oldest first, and a line saying which they are."""
    base_id = git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").stdout.strip()
    if base_id and git("merge-base", "--is-ancestor", base_id, head).returncode == 0:
        selection, which = [head, "--not", f"{base_id}^@"], f"{base} and the commits after it"
    else:
        shallow = git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        why = "this clone is shallow" if shallow else "it is not in this history"
        selection, which = [head], f"every commit there is, as base {base} is missing ({why})"
    # -z: one NUL after each commit, which a message cannot contain.
    listed = git("log", "-z", "--reverse", "--format=%H%n%B", *selection).stdout
    found = [record.partition("\n") for record in listed.split("\0") if record.strip()]
    return [(commit.strip(), message) for commit, _, message in found], which


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=BASE, help=f"the first commit checked (default {BASE})")
    parser.add_argument("--head", default="HEAD", help="the last commit checked (default HEAD)")
    args = parser.parse_args(argv)
    try:
        inside = git("rev-parse", "--git-dir").returncode == 0
    except FileNotFoundError:
        print("commit messages: git is not installed, nothing checked")
        return 0
    if not inside:
        print("commit messages: not a git repository, nothing checked")
        return 0
    if git("rev-parse", "--verify", "--quiet", f"{args.head}^{{commit}}").returncode != 0:
        print(f"commit messages: no commit {args.head}, nothing checked")
        return 0
    checked, which = messages(args.base, args.head)
    bad = 0
    for commit, message in checked:
        wrong = problem(message)
        if wrong is not None:
            bad += 1
            print(f"{commit[:12]} {wrong}: {message.splitlines()[0][:MAX_SUBJECT]}", file=sys.stderr)
    verdict = f"{bad} of {len(checked)} break the rule" if bad else f"all {len(checked)} follow the rule"
    print(f"commit messages: checked {which}: {verdict} (subject <= {MAX_SUBJECT}, blank line before a body)")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
