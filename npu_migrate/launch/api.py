"""The launcher as a Python function: :func:`spawn` runs ``fn`` in one process per device, as ``mp.spawn`` would.

Usage::

    from npu_migrate.launch import spawn

    def train(local_rank, epochs):        # at module level, so the workers can find it
        ...

    spawn(train, args=(10,), nproc=2)     # or options=LaunchOptions(...); raises JobFailed on a failure

The same job as ``python -m npu_migrate.launch`` (configuration, fork server, supervisor, relay),
without the command line's features (migration, probe): those plug into the command line.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from npu_migrate.launch import cpplog
from npu_migrate.launch.setup.config import make_config
from npu_migrate.launch.setup.target import Target
from npu_migrate.launch.errors import JobFailed
from npu_migrate.launch.procs.forkserver import start_fork_server, stop_fork_server
from npu_migrate.launch.procs.supervisor import run_job


def spawn(fn: Callable[..., Any], args: Sequence[Any] = (), options: Any = None, **settings: Any) -> None:
    """Run ``fn(local_rank, *args)`` in one process per device of this node, as ``mp.spawn`` would.

    Every process gets torchrun's variables for its global rank (node rank x nproc + local rank),
    so ``fn`` can call :func:`npu_migrate.init_distributed`. ``fn`` must be importable by name
    (defined at module level) for the worker processes to find it. Their output is relayed as
    on the command line; ``output=output_settings(template="", ...)`` (:mod:`.procs.output`) sets the
    prefix, console filter and ``tee`` there.

    Args:
        fn: the function every process runs.
        args: its arguments after the local rank.
        options: a :class:`npu_migrate.launch.setup.options.LaunchOptions` (the command line's options).
        settings: the same options as keywords, over ``options``: ``nproc``, ``nnodes``,
            ``node_rank``, ``addr``, ``port``, ``device``, ``log_dir``, ``max_restarts``,
            ``join_timeout``, ``job_id``, ``node_timeout``, ``output`` and the others
            :class:`~npu_migrate.launch.setup.options.LaunchOptions` lists.

    Raises:
        LaunchError: bad input; nothing was started.
        JobFailed: a rank failed (its rank, host and error are in the message) or the launcher
            was interrupted.
        TypeError: a keyword that is no launch option.
    """
    methods: list[str] = []
    target = Target(fn=fn, args=tuple(args))
    with cpplog.kept():  # the launcher quiets torch's C++ log; this process goes on after the job
        try:
            cfg = make_config(options, before_device=lambda: methods.append(start_fork_server()),
                              identity=target.identity(), **settings)
        except BaseException:
            stop_fork_server()
            raise
        code = run_job(cfg, target, methods[0])
    if code != 0:
        raise JobFailed(f"the job ended with exit code {code}; see the messages above.", code)
