"""Rank-aware logging.

Usage::

    import logging
    from npu_migrate.log import log_rank0, setup_logging

    logger = logging.getLogger(__name__)
    setup_logging()                      # only in entry points, never in library code
    logger.info("every rank says this")  # [rank 1/2] INFO __main__: every rank says this
    log_rank0(logger, "said once")
"""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "[rank %(rank)s/%(world_size)s] %(levelname)s %(name)s: %(message)s"
PREFIXED_FORMAT = "%(levelname)s %(name)s: %(message)s"
"""The format under a launcher whose relay already starts every line with the rank: one prefix a line."""

ENV_RELAY_PREFIX = "NPU_MIGRATE_RELAY_PREFIX"
"""Set to ``1`` by the launcher in workers whose console lines its relay prefixes with the rank."""

# Checked in this order, as Lightning's ``_get_rank`` does: torchrun and our launcher
# set RANK; Slurm and Open MPI set their own when a job is started by them directly.
_RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _first_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                continue
    return default


def get_rank() -> int:
    """Return this process's global rank from the environment (0 outside a job)."""
    return _first_int(_RANK_VARS, 0)


def get_world_size() -> int:
    """Return the job's world size from the environment (1 outside a job)."""
    return _first_int(_WORLD_SIZE_VARS, 1)


class RankFilter(logging.Filter):
    """Adds ``rank`` and ``world_size`` to every record so formats can show them."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = get_rank()
        record.world_size = get_world_size()
        return True


def setup_logging(
    level: int | str = logging.INFO, stream=None, names: tuple[str, ...] = ("npu_migrate", "__main__")
) -> None:
    """Send the records of the loggers ``names`` to ``stream`` with the rank prefix.

    Call it once from an entry point (an example's ``main``); library code only creates
    loggers. Calling it again replaces the handler instead of adding one. The ``npu-migrate``
    command passes ``names=("npu_migrate",)``: the script it runs owns ``__main__`` and the
    root logger, so its own ``logging.basicConfig`` keeps working.

    Args:
        level: the level of those loggers.
        stream: where records go (default: stderr).
        names: the loggers to configure; each stops propagating to the root logger.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    relayed = os.environ.get(ENV_RELAY_PREFIX) == "1" and stream is None
    handler.setFormatter(logging.Formatter(PREFIXED_FORMAT if relayed else FORMAT))
    handler.addFilter(RankFilter())
    handler.set_name("npu_migrate")
    for name in names:
        log = logging.getLogger(name)
        for old in [h for h in log.handlers if h.get_name() == "npu_migrate"]:
            log.removeHandler(old)
        log.addHandler(handler)
        log.setLevel(level)
        log.propagate = False


def log_rank0(logger: logging.Logger, msg: str, *args: object, level: int = logging.INFO) -> None:
    """Log ``msg`` on global rank 0 only (Lightning's ``rank_zero_info``)."""
    if get_rank() == 0:
        logger.log(level, msg, *args)
