"""Which files are the user's code and which are libraries: the roots caller classification starts from.

Usage::

    from npu_migrate.migrate import usercode

    roots = usercode.resolve()        # from NPU_MIGRATE_USER_CODE, the script, editable installs
    usercode.internal_roots()         # torch, npu_migrate, the standard library, every site-packages
    roots[0].path, roots[0].source    # "/home/me/proj/src/mypkg", "--user-code"

A file belongs to the *longest* root that contains it. Library roots are torch, npu_migrate, the
standard library and every site-packages folder (including one put on ``sys.path`` by hand, as
``pip install --target`` makes). User roots are:

* the script's own folder (``source="script"``);
* packages installed *editable* from inside that folder (pip's ``direct_url.json`` with
  ``dir_info.editable``), where their files are (``source="editable"``);
* what the user names with ``--user-code PATH_OR_PACKAGE`` or ``NPU_MIGRATE_USER_CODE``
  (``os.pathsep``-separated): a folder, a file, or an importable package name, found without
  importing it (``source="--user-code"`` or ``"NPU_MIGRATE_USER_CODE"``).

So a user's own package installed with ``pip install .`` (a library by its path) becomes user code
when named, while a virtual environment inside the script's folder stays a library. A file under
no root is the user's (a script in /tmp, a notebook cell).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any

ENV_USER_CODE = "NPU_MIGRATE_USER_CODE"
"""``os.pathsep``-separated folders, files or package names whose code is the user's."""

ENV_SCRIPT = "NPU_MIGRATE_SCRIPT"
"""The script ``npu-migrate run`` and the launcher run (its folder is user code in every process of the job)."""

ENV_USER_CODE_SOURCE = "NPU_MIGRATE_USER_CODE_SOURCE"
"""Set to ``--user-code`` by the CLIs that filled :data:`ENV_USER_CODE` from their flag (for the report)."""


@dataclass(frozen=True)
class Root:
    """One folder (or file) whose code is classified one way.

    Attributes:
        path: the real path (a folder ends without a separator).
        source: why: ``script``, ``editable``, ``--user-code``, ``NPU_MIGRATE_USER_CODE`` for user
            code; ``library`` for torch, npu_migrate, the standard library and site-packages.
        name: what the user wrote, where it was a package name; else ``""``.
    """

    path: str
    source: str
    name: str = ""

    @property
    def user(self) -> bool:
        """Whether code under this root is the user's."""
        return self.source != "library"


def internal_roots() -> list[Root]:
    """torch, npu_migrate, the standard library and every site-packages folder on the path."""
    paths = sysconfig.get_paths()
    found = {
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # npu_migrate
        *(paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        found.add(os.path.dirname(os.path.abspath(torch.__file__)))
    try:
        import site

        found.update(site.getsitepackages())
        found.add(site.getusersitepackages())
    except (AttributeError, ImportError):
        pass
    # Folders put on the path by hand that are site-packages all the same (pip install --target).
    found.update(p for p in sys.path if os.path.basename(os.path.normpath(p or ".")) in ("site-packages", "dist-packages"))
    return [Root(os.path.realpath(p), "library") for p in sorted(found) if p]


def _locate(entry: str) -> tuple[str, str] | None:
    """``(real path, package name or "")`` for a folder, file or importable package name; None if neither."""
    if os.sep in entry or (os.altsep and os.altsep in entry) or os.path.exists(entry) or entry.endswith(".py"):
        return os.path.realpath(entry), ""
    try:
        spec = importlib.util.find_spec(entry)
    except (ImportError, ValueError):  # a dotted name whose parent fails, or an empty one
        spec = None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return os.path.realpath(list(spec.submodule_search_locations)[0]), entry
    if spec.origin and os.path.isfile(spec.origin):
        return os.path.realpath(spec.origin), entry
    return None


def named_roots() -> list[Root]:
    """The roots ``NPU_MIGRATE_USER_CODE`` names (``--user-code`` sets it).

    Raises:
        UsageError: an entry that is neither an existing path nor an importable package.
    """
    from npu_migrate.errors import UsageError

    value = os.environ.get(ENV_USER_CODE, "")
    source = os.environ.get(ENV_USER_CODE_SOURCE) or ENV_USER_CODE
    roots = []
    for entry in (e.strip() for e in value.split(os.pathsep)):
        if not entry:
            continue
        located = _locate(entry)
        if located is None:
            raise UsageError(
                f"user code {entry!r} (from {source}) is neither a path nor an importable package. "
                "Name a folder, a file or a package installed in this environment."
            )
        roots.append(Root(located[0], source, located[1]))
    return roots


def script_tree() -> str | None:
    """The folder of the job's script (``NPU_MIGRATE_SCRIPT``, else ``__main__``), or None (interactive)."""
    path = os.environ.get(ENV_SCRIPT) or getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or path.startswith("<"):
        return None
    return os.path.dirname(os.path.realpath(path))


def editable_roots(tree: str) -> list[Root]:
    """Packages installed editable (pip's ``direct_url.json``) from a project inside ``tree``."""
    import importlib.metadata
    from urllib.parse import unquote, urlparse

    roots = []
    prefix = os.path.join(tree, "")
    for dist in importlib.metadata.distributions():
        try:
            text = dist.read_text("direct_url.json")
        except OSError:
            continue
        if not text:
            continue
        try:
            info = json.loads(text)
        except ValueError:
            continue
        if not (info.get("dir_info") or {}).get("editable"):
            continue
        url = urlparse(info.get("url", ""))
        if url.scheme != "file":
            continue
        project = os.path.realpath(unquote(url.path))
        if project == tree or project.startswith(prefix):
            roots.append(Root(project, "editable", dist.metadata.get("Name") or ""))
    return roots


def resolve() -> list[Root]:
    """Every user root: the script's folder, its editable installs, and what the user named."""
    roots = []
    tree = script_tree()
    if tree is not None:
        roots.append(Root(tree, "script"))
        roots.extend(editable_roots(tree))
    roots.extend(named_roots())
    return roots


def classify(path: str, roots: list[Root]) -> Root | None:
    """The longest root containing real path ``path``, or None."""
    best: Root | None = None
    for root in roots:
        if path == root.path or path.startswith(os.path.join(root.path, "")):
            if best is None or len(root.path) > len(best.path):
                best = root
    return best


def add_argument(parser: Any) -> None:
    """``--user-code PATH_OR_PACKAGE`` (repeatable), for ``npu-migrate run`` and ``launch --migrate``."""
    parser.add_argument(
        "--user-code", "--user_code", dest="user_code", action="append", default=None, metavar="PATH_OR_PACKAGE",
        help="Treat this folder, file or installed package as your own code, so its CUDA calls are migrated "
             "(repeatable; also NPU_MIGRATE_USER_CODE). Default: the script's folder and packages installed "
             "editable from it; everything else in site-packages is a library and gets torch's own answers.",
    )


def script_of(script: str, module: bool = False) -> str | None:
    """The file of the job's script, or of the module ``python -m`` would run (found without importing)."""
    if not module:
        return os.path.abspath(script)
    try:
        spec = importlib.util.find_spec(script)
    except (ImportError, ValueError):
        return None
    return os.path.abspath(spec.origin) if spec is not None and spec.origin and os.path.isfile(spec.origin) else None


def export(user_code: list[str] | None, script: str | None) -> None:
    """Pass the job's script and ``--user-code`` entries to every process of the job, and check them.

    Raises:
        UsageError: an entry that is neither a path nor an importable package.
    """
    if script:
        os.environ[ENV_SCRIPT] = script
    if user_code:
        before = os.environ.get(ENV_USER_CODE)
        os.environ[ENV_USER_CODE] = os.pathsep.join([*user_code, *([before] if before else [])])
        os.environ[ENV_USER_CODE_SOURCE] = "--user-code"
    named_roots()  # a typo fails here, in one line, before anything starts
