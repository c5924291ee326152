"""The CUDA-only libraries' table is the one answer: ``ops``, ``port`` and the import hook read it."""

from __future__ import annotations

import pytest

from npu_migrate.libs.table import LIBRARIES, MODULES, SHIM_NOTE


@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_ops_and_port_give_the_same_advice(name: str) -> None:
    from npu_migrate.ops import cuda_only
    from npu_migrate.port.rules import RULES

    library = LIBRARIES[name]
    ops = cuda_only.advice(name)
    assert ops.removesuffix(SHIM_NOTE) == library.advice
    assert ops.endswith(SHIM_NOTE) == library.kept_working
    rules = {rule.code: rule for rule in RULES}
    if library.report:
        assert rules[library.report].fix == ops.removesuffix(SHIM_NOTE), f"{name}: port's fix is not ops' advice"
    if library.rewrite:
        assert library.kept_working and library.rewrite in rules, f"{name}: a rewrite needs a served module"


def test_served_libraries_are_the_hook_s() -> None:
    from npu_migrate.migrate.libraries import libs_hook

    served = {lib.name for lib in LIBRARIES.values() if lib.kept_working}
    assert served == set(libs_hook.ROOTS) == {m.split(".")[0] for m in MODULES}
    for lib in LIBRARIES.values():
        if lib.kept_working:
            assert lib.served in MODULES.values(), f"{lib.name}: {lib.served} serves none of its modules"
