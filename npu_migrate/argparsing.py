"""argparse as every npu_migrate command uses it: usage errors in one line, exit code 2.

Usage::

    from npu_migrate.argparsing import OneLineParser

    parser = OneLineParser(prog="npu-migrate")   # sub-parsers inherit the class
"""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: what was wrong, and where to look."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
