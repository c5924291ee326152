"""``npu-migrate compare A B``: do two training runs agree, and if not, where do they first part?

Usage::

    npu-migrate compare runs/gpu runs/npu                          # two --probe directories
    npu-migrate compare gpu.jsonl npu.jsonl --dtype bfloat16       # the examples' --metrics files
    npu-migrate compare gpu.log npu.log --pattern 'step (?P<step>\\d+) loss (?P<loss>\\S+)'
    npu-migrate compare A B --exact                                # bit-for-bit
    npu-migrate compare A B --rtol 1e-3 --allow-failing-steps 2 --plot cmp.png --json cmp.json

Prints a markdown summary (verdict, first step out of tolerance, max errors, first culprit
module, what only one run has). Exit status: 0 within tolerance, 1 diverged, 2 usage error, or an
input that cannot be read, or a report that cannot be written (the command layer's one rule,
:func:`npu_migrate.argparsing.run_command`). Reading recordings never imports torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from npu_migrate.argparsing import OneLineParser, run_command
from npu_migrate.errors import InputError, NpuMigrateError, UsageError
from npu_migrate.textsafe import printable

PROG = "npu-migrate compare"
"""The prefix of compare's error lines, under either entry point."""

_DTYPES = ("float16", "bfloat16", "float32", "float64")


def build_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Add ``compare`` to ``subparsers`` (or make a stand-alone parser)."""
    description = ("Compare two training runs (--probe directories, --metrics JSON lines, or logs with --pattern) "
                   "step by step and module by module; exit 0 within tolerance, 1 diverged, 2 usage error.")
    if subparsers is None:
        parser = OneLineParser(prog="npu-migrate compare", description=description)
    else:
        parser = subparsers.add_parser("compare", help="Compare two training runs.", description=description)
    parser.add_argument("a", metavar="A", help="The reference run: a --probe DIR, a JSONL file or a log.")
    parser.add_argument("b", metavar="B", help="The run to check, of the same kind.")
    parser.add_argument("--pattern", metavar="REGEX", default=None,
                        help="Read A and B as plain logs: named groups are metrics, (?P<step>...) numbers the "
                             "steps (default: %(default)s, inputs are JSON lines).")
    parser.add_argument("--metric", dest="metrics", metavar="NAME", action="append", default=None,
                        help="Compare only this step metric; repeat for more (default: every metric both have, "
                             "without timings).")
    parser.add_argument("--steps", metavar="RANGE", default=None,
                        help="Compare only these steps: N, FIRST:LAST, FIRST: or :LAST (default: all).")
    exact = parser.add_mutually_exclusive_group()
    exact.add_argument("--exact", action="store_true", help="Require bit-for-bit equal values (default: off).")
    exact.add_argument("--rtol", type=float, default=None,
                       help="Relative tolerance (default: torch.testing's for the dtype, times 8).")
    parser.add_argument("--atol", type=float, default=None,
                        help="Absolute tolerance (default: torch.testing's for the dtype, times 8).")
    parser.add_argument("--dtype", choices=_DTYPES, default=None,
                        help="Assume this dtype where the inputs name none, e.g. bfloat16 for an --amp metrics "
                             "file (default: what the recordings say, else float32).")
    parser.add_argument("--allow-failing-steps", dest="allow_failing_steps", type=int, default=0, metavar="N",
                        help="Pass with up to N steps out of tolerance; NaN still fails (default: %(default)s).")
    parser.add_argument("--plot", metavar="FILE.png", default=None,
                        help="Draw both curves and their difference to FILE.png (needs matplotlib) "
                             "(default: %(default)s).")
    parser.add_argument("--json", dest="json_path", metavar="FILE", default=None,
                        help="Write the full result as JSON to FILE (default: %(default)s).")
    parser.add_argument("--markdown", metavar="FILE", default=None,
                        help="Also write the printed markdown summary to FILE (default: %(default)s).")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Compare, print the summary, write what was asked; return 0 or 1, raise a usage or input error (2)."""
    from npu_migrate.compare.reading import report
    from npu_migrate.compare.reading.tolerance import Tolerance
    from npu_migrate.compare.reading.verdict import compare

    if args.atol is not None and args.exact:
        raise UsageError("--exact allows no difference at all; drop --atol or drop --exact.")
    try:
        tolerance = Tolerance(rtol=args.rtol, atol=args.atol, exact=args.exact, dtype=args.dtype)
        result = compare(args.a, args.b, tolerance, allow_failing_steps=args.allow_failing_steps,
                         steps=args.steps, metrics=args.metrics, pattern=args.pattern)
        text = report.markdown(result)
        if args.plot:
            from npu_migrate.compare.reading import plot

            plot.write_png(result, args.plot)
    except (NpuMigrateError, ValueError, OSError) as exc:  # the readers name the file and line
        raise InputError(printable(str(exc), 1000)) from exc
    except RecursionError:  # the readers name the line where they meet one; this is the last resort
        raise InputError("an input is nested too deeply to be a recording; check that A and B are the runs you "
                         "meant.") from None
    # Everything from the recordings was cleaned as it was read; this pass keeps the report so
    # whatever a later change lets through.
    text = printable(text, limit=len(text), keep_newlines=True)
    print(text)
    try:
        if args.json_path:
            report.write_json(result, args.json_path)
        if args.markdown:
            from npu_migrate import fileio

            fileio.write_private_atomic(args.markdown, text + "\n")
    except (NpuMigrateError, OSError) as exc:
        raise InputError(f"cannot write the report: {printable(str(exc), 1000)}") from exc
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    """``python -m npu_migrate.compare``: the same lines and exit codes as ``npu-migrate compare``."""
    args = build_parser().parse_args(argv)  # a usage error: argparse's line and SystemExit(2)
    return run_command(PROG, lambda: run(args))
