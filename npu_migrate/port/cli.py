"""``npu-migrate port`` and ``npu-migrate check``: port a tree of CUDA-only source, or list what needs it.

Usage::

    npu-migrate port train.py                      # print the diff and the findings; write nothing
    npu-migrate port src/ --out ported/ -j 4       # mirror src/ into ported/, Python files ported
    npu-migrate port src/ --in-place               # rewrite in place; every changed file keeps a .orig
    npu-migrate port src/ --out p/ --report port.md --json port.json --style torch
    npu-migrate check src/                         # path:line:col NMxxx message; exit 1 if any
    npu-migrate port nb.ipynb --out ported/         # notebooks: code cells ported, the rest kept
    npu-migrate port --list-rules

Exit codes (the command layer's one rule, :func:`npu_migrate.argparsing.run_command`): 0 fine; 1 a
file failed to parse or read (it is reported, copied unchanged where it could be read, and the
rest go on), or ``check`` found something; 2 usage errors, a missing PATH, an output that cannot be
written; 141 the reader of the output went away.

``--in-place`` policy: before a changed file is overwritten, its original is saved next to it as
``FILE.orig``. If any such backup already exists nothing at all is written, so a backup is never
overwritten; unchanged files are not touched. Works the same inside and outside git.
"""

from __future__ import annotations

import argparse
import difflib
import io
import json
import os
import shutil
import sys
import tokenize
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

from npu_migrate.argparsing import OneLineParser
from npu_migrate.errors import InputError, UsageError, is_closed_pipe
from npu_migrate.port import PortSyntaxError, port_source
from npu_migrate.port.report import FileResult, to_json, to_markdown, totals
from npu_migrate.port.rules import RULES, STYLES, select_rules

_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".ipynb_checkpoints"}
_PYTHON_SUFFIXES = (".py", ".ipynb")


# --------------------------------------------------------------------------- parser


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="Python files, notebooks (.ipynb) or directories to read.")
    p.add_argument("--select", metavar="CODES", default="",
                   help="Comma-separated rule codes or prefixes to apply, e.g. NM001,NM1 (default: all).")
    p.add_argument("--ignore", metavar="CODES", default="",
                   help="Comma-separated rule codes or prefixes to leave out (default: none).")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="Port files in N processes (default: %(default)s).")
    p.add_argument("--style", choices=STYLES, default="npu_migrate",
                   help="Output style: npu_migrate writes nm.* calls; torch writes plain torch.accelerator code "
                        "with no npu_migrate dependency (default: %(default)s).")
    p.add_argument("--report", metavar="FILE.md", help="Write a markdown report of every change and finding.")
    p.add_argument("--json", metavar="FILE", help="Write the same report as JSON.")
    p.add_argument("--list-rules", action="store_true", help="Print the rule table and exit.")


def build_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """Add the ``port`` and ``check`` sub-commands to ``subparsers`` (or a new parser); return ``port``'s."""
    if subparsers is None:
        root = OneLineParser(prog="npu-migrate")
        subparsers = root.add_subparsers(dest="command", required=True)
    port = subparsers.add_parser(
        "port", help="Rewrite CUDA-only PyTorch source into device-neutral source.",
        description="Rewrite CUDA-only PyTorch source into device-neutral source. Without --out or "
                    "--in-place nothing is written: the diff and the findings are printed.",
    )
    _add_common(port)
    where = port.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR",
                       help="Write a mirror of the input tree to DIR: Python files ported, other files copied.")
    where.add_argument("--in-place", action="store_true",
                       help="Rewrite the input files; each changed file keeps its original as FILE.orig.")
    port.set_defaults(func=run, mode="port")
    check = subparsers.add_parser(
        "check", help="List what needs porting as path:line:col NMxxx message; exit 1 if anything does.",
        description="List every site a port rule would rewrite or that needs a human, one per line as "
                    "path:line:col NMxxx message. Exit 1 if there is any, 0 if none.",
    )
    _add_common(check)
    check.set_defaults(func=run, mode="check", out=None, in_place=False)
    return port


# --------------------------------------------------------------------------- files


def _codes(text: str) -> list[str]:
    return [c for c in text.split(",") if c.strip()]


def _collect(paths: Sequence[str], out: Optional[Path]) -> list[tuple[Path, str, str]]:
    """Every file under ``paths`` as (absolute path, path to show, path relative to the output root)."""
    if not paths:
        raise UsageError("No PATH given. Expected one or more files or directories, e.g. npu-migrate port src/.")
    roots = []
    for given in paths:
        p = Path(given)
        if not p.exists():
            raise InputError(f"{given}: no such file or directory. Pass existing files or directories.")
        roots.append((given, p.resolve()))
    prefix_names = len(roots) > 1
    names = [root.name for _, root in roots]
    if prefix_names and len(set(names)) != len(names):
        raise UsageError(f"Inputs {', '.join(paths)} share a base name, so --out could not keep them apart. "
                         "Port them one at a time.")
    files: list[tuple[Path, str, str]] = []
    for given, root in roots:
        if out is not None and (out == root or root in out.parents):
            raise UsageError(f"--out {out} is inside the input {given}. Choose a directory outside the input tree.")
        if root.is_file():  # a file keeps its name at the top of --out, alone or beside others
            files.append((root, given, root.name))
            continue
        top = root.name + "/" if prefix_names else ""
        for dirpath, dirnames, filenames in os.walk(root):  # does not follow links to directories: no loops
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            for name in sorted(filenames):
                full = Path(dirpath, name)
                rel = full.relative_to(root).as_posix()
                files.append((full, os.path.join(given, rel), top + rel))
    return files


def _decode(data: bytes) -> tuple[str, str]:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding), encoding


def port_file(path: str, shown: str, rel: str, style: str, select: Sequence[str], ignore: Sequence[str],
              report_only: bool) -> FileResult:
    """Port one file (in a worker process with ``-j``); never raises for a bad file.

    Args:
        path: the file to read.
        shown: the path to print.
        rel: the path relative to the output root.
        style: the output style.
        select: rule codes to apply (empty: all).
        ignore: rule codes to leave out.
        report_only: report rewrites instead of doing them (``check``).

    Returns:
        The result; ``failed`` with a one-line reason when the file does not decode or parse.
    """
    try:
        if not path.endswith(_PYTHON_SUFFIXES):
            # Other files are only copied (by streaming, in _write_out): never read them here, so a
            # checkpoint of many GB in the tree costs no memory.
            return FileResult(shown, rel, "copied", size=os.stat(path).st_size)
        data = Path(path).read_bytes()
    except OSError as exc:  # a symlink loop, a dangling link, no permission: one line, the rest goes on
        return FileResult(shown, rel, "failed", f"cannot read: {exc.strerror or exc}", unreadable=True)
    if b"\0" in data:
        return FileResult(shown, rel, "failed", "binary file (contains NUL bytes)", size=len(data))
    if path.endswith(".ipynb"):
        return _port_notebook_file(data, shown, rel, style, select, ignore, report_only)
    try:
        text, encoding = _decode(data)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        return FileResult(shown, rel, "failed", f"cannot decode: {' '.join(str(exc).split())}", size=len(data))
    try:
        result = port_source(text, style=style, select=select or None, ignore=ignore or None,
                             report_only=report_only)
    except PortSyntaxError as exc:
        return FileResult(shown, rel, "failed", f"does not parse: {exc}", size=len(data))
    except RecursionError:
        return FileResult(shown, rel, "failed", "too deeply nested for the parser", size=len(data))
    if not result.changed:
        return FileResult(shown, rel, "unchanged", changes=result.changes, findings=result.findings, size=len(data))
    return FileResult(shown, rel, "changed", changes=result.changes, findings=result.findings, size=len(data),
                      output=result.code.encode(encoding), source_text=text, output_text=result.code)


def _port_notebook_file(data: bytes, shown: str, rel: str, style: str, select: Sequence[str],
                        ignore: Sequence[str], report_only: bool) -> FileResult:
    from npu_migrate.port.notebook import NotebookError, port_notebook

    try:
        text = data.decode("utf-8")
        result = port_notebook(text, style=style, select=select or None, ignore=ignore or None,
                               report_only=report_only)
    except UnicodeDecodeError as exc:
        return FileResult(shown, rel, "failed", f"cannot decode: {exc.reason} (notebooks are UTF-8)", size=len(data))
    except NotebookError as exc:
        return FileResult(shown, rel, "failed", str(exc), size=len(data))
    notes = "; ".join(f"cell {cell} left as it is: {why}" for cell, why in result.skipped)
    if not result.changed:
        return FileResult(shown, rel, "unchanged", notes, changes=result.changes, findings=result.findings,
                          size=len(data))
    return FileResult(shown, rel, "changed", notes, changes=result.changes, findings=result.findings, size=len(data),
                      output=result.text.encode("utf-8"), source_text=text, output_text=result.text)


def _port_job(job: tuple) -> FileResult:
    return port_file(*job)


def port_paths(files: Sequence[tuple[Path, str, str]], style: str, select: Sequence[str], ignore: Sequence[str],
               report_only: bool = False, jobs: int = 1) -> list[FileResult]:
    """Port every file, in ``jobs`` processes; results come back in input order."""
    work = [(str(p), shown, rel, style, tuple(select), tuple(ignore), report_only) for p, shown, rel in files]
    python = sum(1 for w in work if w[0].endswith(_PYTHON_SUFFIXES))
    if jobs <= 1 or python < 2:
        return [_port_job(w) for w in work]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_port_job, work, chunksize=1))  # a few big files must not land in one chunk


def _write_atomic(path: Path, data: bytes, like: Optional[Path] = None) -> None:
    from npu_migrate import fileio  # a fresh temporary file, never a planted symlink

    mode = (os.stat(like).st_mode & 0o7777) if like is not None else fileio.default_mode()
    fileio.write_atomic(path, data, mode=mode)


def _write_out(files: Sequence[tuple[Path, str, str]], results: Sequence[FileResult], out: Path) -> None:
    for (src, _, rel), result in zip(files, results):
        if result.unreadable:
            continue  # reported already; there is nothing to copy
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if result.output is not None:
            _write_atomic(dest, result.output, like=src)
            shutil.copystat(src, dest)
        else:
            shutil.copy2(src, dest)  # streams (sendfile or copyfileobj): never the whole file in memory


def _write_in_place(files: Sequence[tuple[Path, str, str]], results: Sequence[FileResult]) -> None:
    todo = [(src, r) for (src, _, _), r in zip(files, results) if r.output is not None]
    existing = [str(src) + ".orig" for src, _ in todo if Path(str(src) + ".orig").exists()]
    if existing:
        raise UsageError(
            f"Backup {existing[0]} already exists ({len(existing)} in all), so --in-place wrote nothing. "
            "Move the .orig files away (or port with --out DIR) and run again."
        )
    for src, result in todo:
        shutil.copy2(src, str(src) + ".orig")
        _write_atomic(src, result.output, like=src)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- output


def _print_rules() -> None:
    width = max(len(r.name) for r in RULES)
    for r in RULES:
        kind = "rewrite" if r.rewrites else "report "
        print(f"{r.code}  {kind}  {r.name:<{width}}  {r.summary.replace('`', '')}")
        print(f"{'':{len(r.code) + 11 + width}}fix: {r.fix.replace('`', '')}")


def _finding_lines(results: Sequence[FileResult]) -> list[str]:
    return [f"{r.path}:{'' if f.cell is None else f'cell {f.cell}:'}{f.line}:{f.col} {f.code} {f.message}"
            for r in results for f in r.findings]


def _write_reports(args: argparse.Namespace, results: Sequence[FileResult]) -> None:
    from npu_migrate import fileio

    if args.report:
        fileio.write_private_atomic(args.report, to_markdown(results, args.style))
    if args.json:
        fileio.write_private_atomic(args.json, json.dumps(to_json(results, args.style), indent=2) + "\n")


def run(args: argparse.Namespace) -> int:
    """Run ``port`` or ``check`` with parsed arguments and return the exit code.

    Raises:
        UsageError: a bad command line argparse cannot see (exit 2).
        InputError: an input or output path that cannot be read or written (exit 2).
    """
    try:
        return _run(args)
    except OSError as exc:  # unreadable input, unwritable --out or report: one line, no traceback
        if is_closed_pipe(exc):  # `npu-migrate port src | head`: the command layer ends quietly
            raise
        raise InputError(f"{exc.strerror or exc}: {exc.filename or ''}. Check the path and its permissions.") from exc


def _run(args: argparse.Namespace) -> int:
    if args.list_rules:
        _print_rules()
        return 0
    if args.jobs < 1:
        raise UsageError(f"-j {args.jobs}: expected a number of processes of at least 1.")
    select, ignore = _codes(args.select), _codes(args.ignore)
    try:
        select_rules(select or None, ignore or None)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    out = Path(args.out).resolve() if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} is a file. Expected a directory (it is created if missing).")
    files = _collect(args.paths, out)
    results = port_paths(files, args.style, select, ignore, report_only=args.mode == "check", jobs=args.jobs)
    _write_reports(args, results)
    failed = [r for r in results if r.status == "failed"]
    for r in failed:
        kept = " (copied unchanged)" if out is not None and not r.unreadable else ""
        print(f"npu-migrate {args.mode}: error: {r.path}: {r.error}{kept}", file=sys.stderr)
    for r in results:
        if r.status != "failed" and r.error:
            print(f"npu-migrate {args.mode}: note: {r.path}: {r.error}", file=sys.stderr)
    if args.mode == "check":
        lines = _finding_lines(results)
        if lines:
            print("\n".join(lines))
        return 1 if lines or failed else 0
    if out is not None:
        _write_out(files, results, out)
    elif args.in_place:
        _write_in_place(files, results)
    else:
        for r in results:
            if r.source_text is not None and r.output_text is not None:
                sys.stdout.writelines(difflib.unified_diff(
                    r.source_text.splitlines(keepends=True), r.output_text.splitlines(keepends=True),
                    fromfile=f"a/{r.path}", tofile=f"b/{r.path}"))
        lines = _finding_lines(results)
        if lines:
            print("\n".join(lines))
    t = totals(results)
    where = f" into {args.out}" if out is not None else (" in place" if args.in_place else " (dry run: nothing written)")
    print(f"npu-migrate port: {t['python_files']} Python files{where}: {t['changed']} changed, {t['unchanged']} "
          f"unchanged, {t['failed']} failed; {t['changes']} changes, {t['findings']} findings", file=sys.stderr)
    return 1 if failed else 0
