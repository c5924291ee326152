"""A new device family is one row of npu_migrate.registry.DEVICES: every consumer reads the row.

A child process adds an ``xpu`` row (its extension is not installed) before anything reads the
table, then asks each consumer what a user of that family would see: the launcher's interface
variables, ``import torch``'s autoload explanation, the device layer's reason it cannot be used,
``npu-migrate env``'s toolkit warning and runtime migration's early mapping.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import child_env

_PROBE = r'''
import json
from npu_migrate import registry
registry.DEVICES["xpu"] = registry.DeviceSpec(
    "xpu", "xccl", extension="torch_xpu_probe", pip_name="torch-xpu-probe", visible_devices_env="XPU_VISIBLE",
    toolkit=registry.Toolkit("oneAPI", "/opt/intel/oneapi/setvars.sh", ("ONEAPI_ROOT",), "/opt/intel/oneapi",
                             libraries="libsycl*"),
    interface_env=("XCCL_SOCKET_IFNAME",),
)
from npu_migrate import autoload, device, env
from npu_migrate.launch.setup import cluster
import importlib
install = importlib.import_module("npu_migrate.migrate.install")  # the module: the package exports install()

failed = RuntimeError("Failed to load the backend extension: torch_xpu_probe. You can disable extension auto-loading")
failed.__cause__ = ImportError("libsycl.so.8: cannot open shared object file")
xpu = registry.DEVICES["xpu"]
print(json.dumps({
    "ifname_vars": list(cluster.SOCKET_IFNAME_VARS),
    "network": cluster.network_env("127.0.0.1", "xccl", {})[0],
    "network_user": cluster.network_env("127.0.0.1", "xccl", {"XCCL_SOCKET_IFNAME": "ib0"}),
    "explain": autoload.explain(failed),
    "unavailable": device.unavailable_reason(xpu),
    "warnings": env._warnings(xpu, device.Selection(xpu, "argument"), {}),
    "early": getattr(install._family_before_detection("xpu"), "name", None),
}))
'''


def test_a_new_row_reaches_every_consumer() -> None:
    run = subprocess.run([sys.executable, "-c", _PROBE], env=child_env(NPU_MIGRATE_DEVICE="cpu"),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.splitlines()[-1])
    assert "XCCL_SOCKET_IFNAME" in got["ifname_vars"]
    assert got["network"] == {"GLOO_SOCKET_IFNAME": "lo", "XCCL_SOCKET_IFNAME": "lo"}
    assert got["network_user"] == [{}, "interface from XCCL_SOCKET_IFNAME=ib0"]  # the user's choice wins
    assert got["explain"] == (
        "`import torch` failed: it auto-loads torch_xpu_probe, which failed: libsycl.so.8: cannot open shared "
        "object file. To use the XPU, source the oneAPI environment first (source /opt/intel/oneapi/setvars.sh); "
        "to train on cuda or cpu, set TORCH_DEVICE_BACKEND_AUTOLOAD=0 (--device cuda or --device cpu does this "
        "for you).")
    assert got["unavailable"].startswith("xpu needs torch_xpu_probe, which is not installed.")
    assert got["unavailable"].endswith("(and the oneAPI toolkit it needs).")
    assert "torch-xpu-probe" in got["unavailable"] and "torch-npu" not in got["unavailable"]
    assert "The oneAPI environment is not sourced (ONEAPI_ROOT is unset): source /opt/intel/oneapi/setvars.sh." \
        in got["warnings"]
    assert got["early"] == "xpu"
