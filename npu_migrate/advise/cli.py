"""``npu-migrate advise``: what to change in a CUDA script, and around it, for speed on the NPU, before booking one.

Usage::

    npu-migrate advise train.py --epochs 1                      # 2 optimizer steps on this CPU
    npu-migrate advise --torch-npu 2.1.0.post17 --json advice.json --markdown advice.md train.py
    npu-migrate advise --ops-json ops.json train.py             # the operator audit of the same run too

The script runs exactly as ``npu-migrate ops`` runs it (:func:`npu_migrate.ops.cli.audit`, with
its options), with :class:`npu_migrate.advise.watch.Watch` watching the same run; the advice is
built by :mod:`npu_migrate.advise.report`.

Exit status: 0 when there is nothing to change (code and environment), 1 when there is advice (or
the script failed before its steps), 2 for a usage error. The operator audit's own verdict does
not count here: ``--ops-json``/``--ops-markdown`` write it, and ``npu-migrate ops`` exits on it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from npu_migrate.argparsing import OneLineParser
from npu_migrate.errors import UsageError


def build_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Add ``advise`` to ``subparsers`` (or make a stand-alone parser)."""
    from npu_migrate.ops import cli as ops_cli  # torch-free at import

    description = ("Run a CUDA training script for a few optimizer steps on this CPU, as `npu-migrate ops` does, "
                   "and say what to change for speed on the NPU with one torch-npu release: fused kernels for "
                   "hand-written patterns, optimizers, data loading, host syncs, environment variables.")
    if subparsers is None:
        parser = OneLineParser(prog="npu-migrate advise", description=description)
    else:
        parser = subparsers.add_parser("advise", help="Say what to change for speed on the NPU.",
                                       description=description)
    parser.add_argument("--ops-json", dest="ops_json", default=None, metavar="FILE",
                        help="Also write the operator audit of the same run as JSON (npu-migrate ops --json).")
    parser.add_argument("--ops-markdown", dest="ops_markdown", default=None, metavar="FILE",
                        help="Also write the operator audit of the same run as markdown.")
    ops_cli.add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """``npu-migrate advise``: audit and watch, print the advice, write the files; return the exit status."""
    from npu_migrate.ops import cli as ops_cli
    from npu_migrate.textsafe import printable

    ops_cli.check_args(args)
    for flag, path in (("--ops-json", args.ops_json), ("--ops-markdown", args.ops_markdown)):
        ops_cli.check_output(flag, path)
    from npu_migrate.advise import report
    from npu_migrate.advise.watch import Watch
    from npu_migrate.ops import report as ops_report

    watches: list[Watch] = []

    def attach(recorder: Any) -> Watch:
        watches.append(Watch(recorder))
        return watches[-1]

    ops_data, failure = ops_cli.audit(args, attach=attach)
    (seen,) = watches
    data = report.build(seen, seen.recorder, seen.recorder.judge.operators, os.environ)
    sys.stdout.flush()
    print(report.to_markdown(data))
    ops_cli.write_reports(report, data, args.json_path, args.markdown_path)
    ops_cli.write_reports(ops_report, ops_data, args.ops_json, args.ops_markdown)
    if failure:
        print(f"npu-migrate advise: {printable(failure)}; the advice covers what ran before it.", file=sys.stderr)
        return 1
    return report.exit_status(data)
