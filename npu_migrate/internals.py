"""Every private torch, stdlib and library name npu_migrate relies on: where, why, and from which torch.

Usage::

    from npu_migrate.internals import INTERNALS, missing

    for entry in INTERNALS:
        print(entry.name, entry.used_in, entry.why)
    missing()          # [(entry, "AttributeError: ...")] for this torch: what an upgrade broke

Whoever upgrades torch (or Python) reads this list first: each entry is a name outside any public
API that a call site reads, patches or imports. Each call site is guarded (a ``getattr`` default, a
``hasattr`` branch, an ``ImportError`` fallback), so a missing name degrades a feature rather than
breaking an import; ``tests/test_internals.py`` resolves every entry on the installed torch and fails
by name, and fails too when the package uses a private name that is not listed here.

An entry's ``names`` are the alternatives its call site tries, in order (``torch._C.TensorBase``,
else ``torch._C._TensorBase``); it holds when one of them resolves. ``since`` and ``until`` bound the
torch releases where the call site needs it (the others take another path). An entry whose ``extra``
distribution is not installed is not checked (that feature is an optional extra).
Nothing here imports torch until :func:`resolve` or :func:`missing` is called.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Internal:
    """One private name relied on.

    Attributes:
        names: dotted paths that resolve from an importable module, the call site's alternatives in
            order; an attribute set on instances only is reached through a module-level instance
            (``torch.ops.aten.add.Tensor._schema`` for ``OpOverload._schema``) or ``probe``.
        used_in: the package's modules that use it.
        why: what the call site needs it for, and what it does without it.
        since: first torch release (``"2.5"``) where the call site uses it, else every release.
        until: last torch release where it does.
        extra: the optional distribution it belongs to (``s3fs``), checked only where installed.
        probe: builds what the name is read from, for attributes set on instances only.
    """

    names: tuple[str, ...]
    used_in: tuple[str, ...]
    why: str
    since: str | None = None
    until: str | None = None
    extra: str | None = None
    probe: Callable[[], Any] | None = None

    @property
    def name(self) -> str:
        """The first alternative: how a message names the entry."""
        return self.names[0]


def _process_target() -> Any:
    import multiprocessing

    return multiprocessing.Process(target=print, args=(1,))


def _module() -> Any:
    import torch

    return torch.nn.Linear(1, 1)


def _compiled_module() -> Any:
    import torch

    return torch.compile(torch.nn.Linear(1, 1))  # nothing is compiled before its first call


def _I(names: str | tuple[str, ...], used_in: str | tuple[str, ...], why: str, **kw: Any) -> Internal:  # noqa: N802
    return Internal(
        (names,) if isinstance(names, str) else names, (used_in,) if isinstance(used_in, str) else used_in, why, **kw)


_DYNAMO = "torch._dynamo.variables"

INTERNALS: tuple[Internal, ...] = (
    # ------------------------------------------------------------------ torch: dynamo (torch.compile)
    _I("torch._dynamo", "migrate/patches/compiled.py",
       "whether dynamo is imported yet: its patches wait for the first torch.compile (importing it costs seconds)"),
    _I(f"{_DYNAMO}.ctx_manager.AutocastModeVariable.create", "migrate/patches/compiled.py",
       "torch.autocast('cuda') traced by torch.compile runs the target's autocast; without it, compiled "
       "autocast stays on cuda"),
    _I((f"{_DYNAMO}.tensor.TensorVariable.method_attr_is_cuda", f"{_DYNAMO}.tensor.TensorVariable.var_getattr"),
       "migrate/patches/compiled.py",
       "x.is_cuda in traced user code answers for the target (newer dynamo: one method per attribute; "
       "torch 2.1: var_getattr)"),
    _I((f"{_DYNAMO}.constant.ConstantVariable.create", f"{_DYNAMO}.constant.ConstantVariable"),
       "migrate/patches/compiled.py", "the traced answer to x.is_cuda (torch 2.1 calls the class itself)"),
    # ------------------------------------------------------------------ torch: C bindings and modules
    _I(("torch._C.TensorBase", "torch._C._TensorBase"), "migrate/patches/tensors.py",
       "Tensor.is_cuda is a property of the C base class, patched there (torch < 2.2 names it _TensorBase)"),
    _I("torch._C._current_autograd_node", "ops/record.py",
       "an operator recorded while autograd runs a node belongs to the backward phase"),
    _I("torch._C._disabled_torch_function_impl", "ops/hooks.py",
       "tensor subclasses that disabled __torch_function__ are skipped by the operator audit"),
    _I("torch._C._dispatch_has_kernel_for_dispatch_key", "ops/verdict.py",
       "whether an operator has a kernel of its own for a dispatch key (else it decomposes)"),
    _I("torch._C._jit_get_all_schemas", "cuda_api/devices.py",
       "every aten operator schema: the torch APIs that take a device, for the CUDA table's coverage"),
    _I("torch._import_device_backends", "_torch_hook.py",
       "the fork server imports torch with autoload off; each worker (and a launcher that forked its fork "
       "server) loads the device extensions itself", since="2.5"),
    _I("torch.utils._device._device_constructors", "migrate/patches/tensors.py",
       "the factories `with torch.device(...)` fills in, cached on first use: rebuilt after the patches so "
       "meta models stay on meta"),
    _I("torch.utils._python_dispatch.TorchDispatchMode", "ops/record.py",
       "the operator audit records every aten call in a dispatch mode"),
    _I("torch.utils._pytree.tree_flatten", "launch/hangs/flight.py",
       "the flight record finds the tensors of a DDP forward's outputs"),
    _I("torch.autograd.Variable._execution_engine.queue_callback", "launch/hangs/flight.py",
       "the flight record marks the end of a backward pass from inside it"),
    _I("torch.nn.modules.batchnorm._BatchNorm.forward", "migrate/patches/distributed.py",
       "SyncBatchNorm on the CPU target runs the plain batch norm forward"),
    _I("torch._utils.is_compiling", "compare/recording/module_hooks.py",
       "the probe's module hooks do nothing where dynamo traces them (a constant there); torch >= 2.3 "
       "has torch.compiler.is_compiling", until="2.2"),
    _I("torch._dynamo.eval_frame.OptimizedModule._orig_mod", "compare/recording/module_hooks.py",
       "the model inside torch.compile's wrapper: module names are the model's own (and the seed "
       "checkpoint its state), as for DDP", probe=_compiled_module),
    _I("torch._dynamo.skipfiles.add", "compare/recording/module_hooks.py",
       "torch 2.1's dynamo compiles every frame a compiled model calls: the probe's files go on its skip "
       "list; without it, a helper of the probe's hooks could be compiled", until="2.2"),
    _I("torch._subclasses.fake_tensor.FakeTensor", "compare/recording/module_hooks.py",
       "torch 2.1's dynamo runs a module's hooks on fake tensors to learn its outputs: the probe's do nothing "
       "there", until="2.2"),
    _I("torch.nn.modules.dropout._DropoutNd", "compare/recording/probe.py",
       "--no-dropout finds every dropout module by their common base class"),
    _I("torch.nn.Module._parameters", "compare/recording/module_hooks.py",
       "a module's own parameters, read once per hooked call without named_parameters()'s generator "
       "(the probe's cost per module)", probe=_module),
    _I("torch.Tensor._values", "compare/recording/probe.py", "a sparse gradient's values, recorded like a dense one"),
    _I("torch.ops.aten.add.Tensor._schema", ("ops/record.py", "ops/follow.py"),
       "an operator overload's schema name (OpOverload._schema), as the audit reports it; its arguments' "
       "types and whether it mutates them, for following a composite kernel"),
    _I("torch.ops.aten.add.Tensor._overloadname", "ops/record.py", "an operator overload's name (OpOverload)"),
    _I("torch.ops.aten.add.Tensor._op_dk", "ops/follow.py",
       "runs one dispatch key's kernel of an overload (as OpOverload.decompose does): the audit runs the "
       "composite kernel the NPU runs for an operator the release lacks, to record what it calls"),
    _I("torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional", "ops/verdict.py",
       "the composite dispatch keys (CompositeExplicitAutograd, CompositeImplicitAutograd alike) whose "
       "kernel the audit follows"),
    _I("torch.autograd._profiler_enabled", "profile/recorder.py",
       "whether a profiler records in a rank already (the script's own): --profile does not start beside it, "
       "which would cancel the script's session and make its stop raise (torch 2.1 to 2.6); without it, "
       "a script's profiler running before --profile's steps is cancelled"),
    # ------------------------------------------------------------------ torch.distributed
    _I("torch.distributed.distributed_c10d._world.pg_map", "distributed.py",
       "every live process group, kept alive across destroy_process_group to free its backends without the GIL "
       "(torch < 2.8 could deadlock); without it only the default group is covered"),
    _I("torch.distributed.ProcessGroup._device_types", "distributed.py",
       "the device types a group serves, to collect its backend objects"),
    _I("torch.distributed.ProcessGroup._get_backend", "distributed.py", "a group's backend object per device type"),
    _I("torch.distributed.elastic.rendezvous.dynamic_rendezvous.DynamicRendezvousHandler._stop_heartbeats",
       "launch/nodes/membership.py",
       "stops torch's rendezvous keep-alive timer from the launcher's thread, so its finalizer never joins "
       "its own thread at exit"),
    _I("torch._dynamo.device_interface", "migrate/install.py",
       "imported before torch.cuda is patched, so dynamo's CudaInterface keeps torch's own Event and Stream "
       "(its metaclass asserts their C bases); without it every migrated DDP script failed on torch 2.3-2.5",
       since="2.2", until="2.6"),
    # ------------------------------------------------------------------ stdlib
    _I("sys._getframe",
       ("migrate/callers.py", "migrate/patches/compiled.py", "migrate/patches/data_amp.py",
        "migrate/patches/tensors.py", "ops/cuda_only.py", "ops/record.py", "launch/procs/forkserver.py"),
       "who called a patched API (user code or a library), and whether multiprocessing's fork server is importing"),
    _I("multiprocessing.forkserver.main", "launch/procs/forkserver.py",
       "the fork server's main function, recognised on the stack while it imports the preload modules"),
    _I(("multiprocessing.forkserver._forkserver._forkserver_pid",), "launch/procs/forkserver.py",
       "the fork server's pid, to end it at once after a job (module state of multiprocessing.forkserver)"),
    _I(("multiprocessing.forkserver._forkserver._forkserver_alive_fd",), "launch/procs/forkserver.py",
       "closed with the pid reset so that a second launch in the process starts a fresh fork server"),
    _I(("atexit._run_exitfuncs",), ("launch/procs/forkserver.py", "launch/procs/worker.py"),
       "the forked fork server runs its exit handlers (the workers' cleanup) before os._exit; each rank runs "
       "the script's (atexit, weakref.finalize) at its end as Python does, before multiprocessing's os._exit"),
    _I(("threading._shutdown",), "launch/procs/worker.py",
       "a rank ends as Python does: threading's exit hooks (concurrent.futures' executors) and non-daemon "
       "threads, then atexit; without the hooks first, an atexit handler waiting on inductor's compile pool "
       "hung a compiled script's ranks on torch 2.1"),
    _I(("multiprocessing.resource_tracker._resource_tracker",), ("launch/procs/forkserver.py", "launch/procs/worker.py"),
       "the launcher's resource tracker, forgotten in the forked fork server (its workers get the fd) and in "
       "each rank, which starts its own when it needs one, as a new interpreter does"),
    _I(("multiprocessing.resource_tracker._resource_tracker._fd",), "launch/procs/worker.py",
       "the launcher's resource tracker pipe a rank inherited, closed as it forgets that tracker"),
    _I(("multiprocessing.forkserver._forkserver",), "launch/procs/worker.py",
       "a rank forgets the launcher's fork server (address, alive descriptor, a lock held where it was forked "
       "from the launcher): a DataLoader's forkserver context in a rank starts the rank's own"),
    _I(("multiprocessing.process._current_process", "multiprocessing.process._parent_process",
        "multiprocessing.process._children", "multiprocessing.process._process_counter"), "launch/procs/worker.py",
       "a rank is multiprocessing's MainProcess with no parent, as under torchrun (mp.current_process().name, "
       "parent_process(), its own authentication key and temporary directory)"),
    _I(("multiprocessing.process.AuthenticationString",), "launch/procs/worker.py",
       "the rank's new authentication key, of the type multiprocessing's MainProcess holds"),
    _I(("sys._xoptions",), "launch/procs/forkserver.py",
       "-X faulthandler: the forked fork server keeps the fault handler only where a new one would"),
    _I("multiprocessing.process.BaseProcess._bootstrap", "migrate/patches/processes.py",
       "runtime migration starts in every multiprocessing child (mp.spawn workers) around its target"),
    _I(("multiprocessing.process.BaseProcess._target", "multiprocessing.process.BaseProcess._args"),
       "migrate/lines.py", "the index torch.multiprocessing.spawn gave a worker (its wrapper's first argument)",
       probe=_process_target),
    _I("argparse._SubParsersAction", "port/cli.py", "the type of the sub-command table (annotation only)"),
    # ------------------------------------------------------------------ optional libraries
    _I("s3fs.S3FileSystem._call_s3", "data/storage.py",
       "a ranged GET from an offset (resumed downloads) that s3fs's public API does not offer", extra="s3fs"),
    _I("torch_npu.profiler._ExperimentalConfig", "profile/recorder.py",
       "torch-npu's profiler settings (level, export type): its documented way to configure "
       "torch_npu.profiler.profile despite the underscore; every release's wheel is checked for it and "
       "its keywords by tests/profiling/test_npu_surface.py, as torch_npu cannot be imported without CANN",
       extra="torch_npu"),
)
"""The inventory, by area: dynamo, torch's C bindings and modules, torch.distributed, stdlib, extras."""

ALLOWED: frozenset[str] = frozenset({"os._exit", "_replace", "_asdict", "_fields", "_make"})
"""Underscore names that are documented public API (``os._exit``, namedtuple's methods): never listed."""


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return tuple(int(p) for p in match.groups()) if match else ()


def applies(entry: Internal, torch_version: str) -> bool:
    """Whether the call site needs ``entry`` under ``torch_version`` (and its extra is installed)."""
    release = _release(torch_version)
    if entry.since is not None and release < _release(entry.since):
        return False
    if entry.until is not None and release > _release(entry.until):
        return False
    return entry.extra is None or importlib.util.find_spec(entry.extra) is not None


def resolve_path(path: str, start: Any = None) -> Any:
    """The object at dotted ``path``: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    if start is not None:
        obj, rest = start, parts
    else:
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            rest = parts[cut:]
            break
        else:
            raise ImportError(f"no module of {path!r} can be imported")
    for part in rest:
        obj = getattr(obj, part)
    return obj


def resolve(entry: Internal) -> str | None:
    """``None`` when one of ``entry.names`` resolves, else why the last one did not (one line)."""
    error = ""
    for path in entry.names:
        try:
            if entry.probe is not None:
                getattr(entry.probe(), path.rsplit(".", 1)[1])
            else:
                resolve_path(path)
            return None
        except (ImportError, AttributeError) as exc:
            error = f"{type(exc).__name__}: {exc}"
    return error


def missing(torch_version: str | None = None) -> list[tuple[Internal, str]]:
    """Every entry the installed torch needs but lacks, with the reason (imports torch)."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    return [(e, why) for e in INTERNALS if applies(e, torch_version) and (why := resolve(e)) is not None]
