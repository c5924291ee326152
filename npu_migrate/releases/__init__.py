"""Released torch-npu packages, read in place: the one source of facts about Ascend's torch.

Every torch-npu wheel on the package index installs without CANN and is a plain zip file. What
this toolkit says about a release (the torch it requires, the operators it registers for the
NPU, the names and signatures of ``torch_npu.npu``) is read from the release itself, never
restated by hand:

Usage::

    from npu_migrate import releases

    release = releases.find("2.14.0")          # installed, cached, or downloaded once
    release.version                             # "2.14.0"
    release.requires_torch                      # "torch==2.14.0.*"
    release.read_text("torch_npu/npu/__init__.py")

    releases.installed()                        # the torch_npu of this environment, or None

    from npu_migrate.releases import pairs, surface
    pairs.accepts(release.requires_torch, "2.14.0")    # PEP 440, local builds included
    surface.read(release)["set_device"].signature()    # torch_npu.npu's names, read with ast

Modules, each owning one concept:

* :mod:`.wheels`: where a release's files come from: the installed package, a cached wheel, the index;
* :mod:`.pairs`: which torch a release accepts, the installed pair, the release that pairs with a torch;
* :mod:`.surface`: the public names of ``torch_npu.npu``, read from the release's source with ``ast``;
* :mod:`.signatures`: signatures as data: parameters from source or a live object, written and compared;
* :mod:`.operators`: the operators a release registers for the NPU, read from its codegen YAML;
* :mod:`.checked`: the torch lines ``.ci/matrix`` checked this checkout on, and when (``checked.json``).

Nothing here imports torch (or torch_npu): the wheel's files are read as text.
"""

from __future__ import annotations

from npu_migrate.releases.wheels import (
    ReleaseNotFound,
    Release,
    cache_dir,
    find,
    installed,
)

__all__ = ["Release", "ReleaseNotFound", "cache_dir", "find", "installed"]
