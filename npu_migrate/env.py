"""``npu-migrate env``: what npu_migrate sees on this machine, for bug reports and first checks.

Usage::

    npu-migrate env            # readable report
    npu-migrate env --json     # the same as one JSON object
    npu-migrate env --device npu   # fails in one line if torch_npu cannot be used
    npu-migrate env --releases     # may download the torch-npu wheel that pairs with this torch

Like ``accelerate env``, it names the chosen device family and why, the backend, versions, the
variables that steer the Ascend/CUDA/collective stacks, and warnings for known problems.

torch and torch_npu are checked as a pair from package metadata: the torch the installed
torch_npu release declares (``Requires-Dist``) and whether the installed torch satisfies it. Where
torch_npu is not installed, the release that pairs with the installed torch is read from a cached
wheel (:mod:`npu_migrate.releases`); nothing is downloaded unless ``--releases`` asks for it.
``torch_line_checked`` says whether ``.ci/matrix`` checked this torch's line, and when
(:mod:`npu_migrate.releases.checked`).
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import platform
import sys
from typing import Any

from npu_migrate import __version__
from npu_migrate.registry import DEVICES, FAMILY_CHOICES, SOURCE_FAMILY, DeviceSpec, Toolkit

# Variables of torchrun and npu_migrate that matter to every family, and each family's mask and allocator.
_JOB_VARS = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "NODE_RANK", "OMP_NUM_THREADS", "TORCH_DEVICE_BACKEND_AUTOLOAD",
) + tuple(v for s in DEVICES.values() for v in (s.visible_devices_env, s.alloc_conf_env) if v)
_ENV_PREFIXES = ("NPU_MIGRATE_",) + tuple(p for s in DEVICES.values() for p in s.env_prefixes)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _toolkit_version(toolkit: Toolkit) -> str | None:
    """The version a family's toolkit wrote under its home (CANN: ``ascend_toolkit_install.info``)."""
    home = next((os.environ[v] for v in toolkit.home_env if os.environ.get(v)), toolkit.default_home)
    for pattern in toolkit.version_files:
        for path in sorted(glob.glob(os.path.join(home, pattern))):
            try:
                with open(path, encoding="utf-8") as fh:
                    for line in fh:
                        key, _, value = line.partition("=")
                        if key.strip() == "version":
                            return value.strip()
            except OSError:
                continue
    return None


def _relevant_env() -> dict[str, str]:
    return {
        key: value
        for key, value in sorted(os.environ.items())
        if key in _JOB_VARS or key.startswith(_ENV_PREFIXES)
    }


def _warnings(spec: DeviceSpec, selection: Any, variables: dict[str, str]) -> list[str]:
    import torch

    from npu_migrate import device as _device

    warnings = list(selection.skipped)
    others = [s for s in _device.DEVICES.values() if s.name != spec.name and s.is_accelerator]
    if spec.is_accelerator:
        for other in others:
            # A mask or allocator setting for another family is silently ignored by this one.
            for attr in ("visible_devices_env", "alloc_conf_env"):
                theirs, ours = getattr(other, attr), getattr(spec, attr)
                if theirs and theirs in variables and ours not in variables:
                    warnings.append(
                        f"{theirs} is set but has no effect on {spec.name}; set {ours} instead."
                    )
            for key in variables:
                if other.backend != spec.backend and key.startswith(other.backend.upper() + "_"):
                    equivalent = spec.backend.upper() + key[len(other.backend) :]
                    warnings.append(
                        f"{key} is set but {spec.backend} ignores it; look for {equivalent} "
                        f"in the {spec.backend.upper()} documentation."
                    )
    toolkit = spec.toolkit
    if toolkit is not None and not any(os.environ.get(v) for v in toolkit.home_env):
        warnings.append(f"The {toolkit.name} environment is not sourced ({toolkit.home_env[0]} is unset): "
                        f"source {toolkit.set_env}.")
    for other in others:
        # The source family's mask is read on every family (migration, the CPU device count).
        if other.name != SOURCE_FAMILY and other.visible_devices_env in variables:
            warnings.append(f"{other.visible_devices_env} is set but the job runs on {spec.name}.")
    if _device._release_tuple(torch.__version__)[:2] < (2, 1):
        warnings.append(f"torch {torch.__version__} is older than 2.1, which npu_migrate needs.")
    return warnings


def collect(device: str | None = None, fetch_releases: bool = False) -> dict[str, Any]:
    """Return the environment report as a JSON-ready dict.

    Args:
        device: the family to force, else detection.
        fetch_releases: where torch_npu is not installed and no cached wheel pairs with the
            installed torch, download the newest torch-npu of torch's release line to read it.

    Raises:
        UnknownDeviceError, DeviceUnavailableError: as :func:`npu_migrate.device.resolve_device`.
    """
    import torch

    from npu_migrate import device as _device
    from npu_migrate.releases import checked

    selection = _device.resolve_device(device)
    spec = selection.spec
    variables = _relevant_env()
    report: dict[str, Any] = {
        "npu_migrate_version": __version__,
        "device_type": spec.name,
        "device_source": selection.source,
        "backend": _device.default_backend(spec),
        "device_count": _device._count(spec),  # the chosen family's, read without setting ENV_DEVICE
        "device_name": _device._name(spec) if spec.is_accelerator else None,
        "torch_version": torch.__version__,
        "torchvision_version": _dist_version("torchvision"),
        "torch_line_checked": checked.summary(torch.__version__),  # .ci/matrix's record of this torch's line
        # One line per family's extension (torch_npu_version), torch build (torch_cuda_version), toolkit (cann_version).
        **{f"{s.extension}_version": _device.extension_version(s) for s in _device.DEVICES.values() if s.extension},
        **{f"torch_{s.torch_build}_version": getattr(torch.version, s.torch_build, None)
           for s in _device.DEVICES.values() if s.torch_build},
        **{f"{s.toolkit.name.lower()}_version": _toolkit_version(s.toolkit)
           for s in _device.DEVICES.values() if s.toolkit},
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "families": {name: _device.is_available(name) for name in _device.DEVICES},
        "environment": variables,
    }
    released = _released_key()
    pair, pair_warning = _pair(fetch_releases, report[released])
    keys = list(report)
    at = keys.index(released) + 1  # the pair's lines next to torch_npu's version
    report = {**{k: report[k] for k in keys[:at]}, **pair, **{k: report[k] for k in keys[at:]}}
    report["warnings"] = _warnings(spec, selection, variables) + ([pair_warning] if pair_warning else [])
    return report


def _released_key() -> str:
    """The report key of the extension :mod:`npu_migrate.releases` reads the wheels of (``torch_npu_version``)."""
    from npu_migrate.releases import wheels

    spec = next(s for s in DEVICES.values() if s.pip_name == wheels.DISTRIBUTION)
    return f"{spec.extension}_version"


def _pair(fetch: bool, npu_version: str | None) -> tuple[dict[str, Any], str | None]:
    """What the installed torch_npu declares, or which release pairs with the installed torch;
    and the warning for a pair the release does not declare.

    A torch_npu without package metadata (built from source, on PYTHONPATH) declares nothing.
    """
    from npu_migrate.releases import pairs

    check = pairs.check_installed()
    if check.npu is None and npu_version is not None:
        check = pairs.check(check.torch, npu_version, None)
    out: dict[str, Any] = {
        "torch_npu_requires": check.requires,
        "torch_pair_declared": check.declared,
        "torch_npu_pairing": None,
        "pairing_source": None,
    }
    return _pairing(out, check, fetch), check.warning()


def _pairing(out: dict[str, Any], check: Any, fetch: bool) -> dict[str, Any]:
    """Without torch_npu: the release that declares the installed torch (cached; fetched if asked)."""
    from npu_migrate.releases import ReleaseNotFound, pairs

    if check.npu is None and check.torch is not None:
        found = pairs.pairing(check.torch)
        source = "cache"
        if found is None:
            found = pairs.same_line(check.torch)  # e.g. a +cpu build of this release is declared
        if found is None and fetch:
            try:
                found = pairs.fetch_pairing(check.torch)
                source = "downloaded"
            except ReleaseNotFound as exc:
                out["pairing_source"] = f"not found: {exc}"
                return out
        if found is None:
            out["pairing_source"] = "no cached wheel accepts it; `npu-migrate env --releases` looks it up"
        elif not pairs.accepts(found.requires_torch or "torch<0", check.torch):
            out["pairing_source"] = (
                f"none: the newest release of this line, torch-npu {found.version} ({source}), declares "
                f"{found.requires_torch}; {pairs.install_torch(found.requires_torch or '')} to pair with it"
            )
        else:
            out["torch_npu_pairing"] = f"{found.version} ({found.requires_torch})"
            out["pairing_source"] = source
    return out


def format_report(report: dict[str, Any]) -> str:
    """Render :func:`collect`'s dict as the text ``npu-migrate env`` prints."""
    lines = ["npu_migrate environment", ""]
    scalars = {k: v for k, v in report.items() if not isinstance(v, (dict, list))}
    width = max(len(k) for k in scalars)
    for key, value in scalars.items():
        if key == "device_type":
            value = f"{value} ({report['device_source']})"
        elif key == "device_source":
            continue
        lines.append(f"- {key:<{width}}  {'-' if value is None else value}")
    families = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in report["families"].items())
    lines.append(f"- {'families':<{width}}  {families}")
    lines += ["", "Environment variables:"]
    lines += [f"  {k}={v}" for k, v in report["environment"].items()] or ["  (none set)"]
    lines += ["", "Warnings:"]
    lines += [f"  ! {w}" for w in report["warnings"]] or ["  (none)"]
    return "\n".join(lines)


def build_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Add ``env`` to ``subparsers`` (or make a stand-alone parser)."""
    kwargs = {"description": "Show the device family, backend, versions and settings npu_migrate sees."}
    if subparsers is None:
        parser = argparse.ArgumentParser(prog="npu-migrate env", **kwargs)
    else:
        parser = subparsers.add_parser("env", help="Show what npu_migrate sees on this machine.", **kwargs)
    parser.add_argument(
        "--device", default=None, choices=FAMILY_CHOICES,
        help="Force a device family instead of NPU_MIGRATE_DEVICE or detection (auto detects).",
    )
    parser.add_argument("--json", action="store_true", help="Print one JSON object instead of text.")
    parser.add_argument(
        "--releases", action="store_true",
        help="Where torch_npu is not installed, download (once, with pip download --no-deps, into the "
        "NPU_MIGRATE_RELEASES_DIR cache) the newest torch-npu of the installed torch's release line "
        "to say which release pairs with it. Without it only cached wheels are read.",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the report; device errors propagate to the CLI, which prints them as one line."""
    report = collect(args.device, fetch_releases=args.releases)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0
