"""torch/torch_npu pairs: decided from the releases' METADATA, and the README's pin agrees with it.

The real wheels are read from ``NPU_MIGRATE_RELEASES_DIR`` (.ci/run keeps them in .ci-cache);
a missing wheel fails under CI (``CI=true``) and skips elsewhere. Nothing is downloaded here.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, child_env, released_wheel, run_cli
from npu_migrate import releases
from npu_migrate.releases import pairs


def _release(version: str) -> releases.Release:
    return released_wheel(version)


def _npu_extra() -> str:
    """The torch-npu version pyproject's [npu] extra pins."""
    text = (ROOT / "pyproject.toml").read_text()
    if sys.version_info >= (3, 11):
        import tomllib

        extra = tomllib.loads(text)["project"]["optional-dependencies"]["npu"]
    else:  # no TOML reader in the standard library before 3.11
        extra = re.findall(r'^npu = \[(.*)\]', text, re.M)[0].replace('"', "").split(",")
    (requirement,) = extra
    match = re.fullmatch(r"torch-npu==(\S+)", requirement.strip())
    assert match, f"the [npu] extra must pin one torch-npu release exactly, not {requirement!r}"
    return match.group(1)


def _readme_torch() -> str:
    """The torch the README's first ci:commands line pins (what tier 1 and users install)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- ci:commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    first = block.strip().splitlines()[0]
    return re.search(r"\btorch==(\S+)", first).group(1)


def test_the_npu_extra_declares_the_readme_pinned_torch() -> None:
    pin, torch_version = _npu_extra(), _readme_torch()
    release = _release(pin)
    assert release.requires_torch, f"torch-npu {pin} declares no torch"
    assert pairs.accepts(release.requires_torch, torch_version), (
        f"the README pins torch {torch_version} but the [npu] extra's torch-npu {pin} declares "
        f"{release.requires_torch}: change one so they pair"
    )


def test_the_old_tier_torch_is_the_release_of_torch_npu_2_1() -> None:
    """torch 2.1.0 (the torch 2.1 tier) is the release torch-npu 2.1.0.post17 was built for, but its
    declared build is the CPU index's +cpu one: a pair env warns about, not one it refuses."""
    release = _release("2.1.0.post17")
    assert release.requires_torch == "torch==2.1.0+cpu"
    readme = (ROOT / "README.md").read_text()
    assert "torch==2.1.0 torchvision==0.16.0" in readme
    check = pairs.check("2.1.0", release.version, release.requires_torch)
    assert (check.declared, check.fatal) == (False, False)
    assert pairs.accepts(release.requires_torch, "2.1.0+cpu")
    assert check.warning() == (
        "torch 2.1.0 and torch_npu 2.1.0.post17 are a pair the release does not declare: torch_npu "
        "2.1.0.post17 declares torch==2.1.0+cpu, a build on PyTorch's index https://download.pytorch.org/whl/cpu. "
        "Install the declared torch: pip install torch==2.1.0+cpu --index-url https://download.pytorch.org/whl/cpu."
    )


def test_the_torch_2_7_tier_installs_the_torch_its_torch_npu_release_declares() -> None:
    """.ci/run's torch 2.7.1 tier reads its torch from its torch-npu release's METADATA at run time
    and installs PyPI's build of that release; the README's Versions table names the same pair."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    npu = re.search(r"^torch27_npu=(\S+)", (ROOT / ".ci" / "run").read_text(), re.M).group(1)
    release = _release(npu)
    (spec,) = Requirement(release.requires_torch).specifier
    torch_release = Version(spec.version.removesuffix(".*")).public
    assert pairs.release_of(torch_release) == pairs.release_of(npu)
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if f" {npu} declares" in line)
    assert f"| {torch_release} |" in row and f"`{release.requires_torch}`" in row, row


@pytest.mark.parametrize(("requirement", "torch_version", "accepted"), [
    ("torch==2.1.0+cpu", "2.1.0", False),        # PyPI's build is not the declared one
    ("torch==2.1.0+cpu", "2.1.0+cpu", True),
    ("torch==2.1.0+cpu", "2.1.0+cu121", False),
    ("torch==2.14.0.*", "2.14.0", True),
    ("torch==2.14.0.*", "2.14.0+cu130", True),   # no local label in the specifier: any build
    ("torch==2.14.0.*", "2.14.1", False),
    ("torch==2.14.0.*", "2.13.0", False),
])
def test_accepts_follows_pep_440(requirement: str, torch_version: str, accepted: bool) -> None:
    assert pairs.accepts(requirement, torch_version) is accepted


def test_requirement_and_install_command_are_read_not_guessed() -> None:
    assert pairs.requirement_of_metadata(["torch (==2.1.0+cpu)"]) == "torch==2.1.0+cpu"
    assert pairs.requirement_of_metadata(["numpy", "torch==2.14.0.*", "pyyaml"]) == "torch==2.14.0.*"
    assert pairs.requirement_of_metadata(["torchvision==0.16.0"]) is None
    assert pairs.install_torch("torch==2.14.0.*") == "pip install torch==2.14.0"
    assert pairs.install_torch("torch==2.1.0+cpu") == (
        "pip install torch==2.1.0+cpu --index-url https://download.pytorch.org/whl/cpu")
    assert pairs.install_torch("torch>=2.1,<2.2") in ('pip install "torch<2.2,>=2.1"', 'pip install "torch>=2.1,<2.2"')


def test_another_release_line_is_fatal_another_build_is_not() -> None:
    assert pairs.check("2.14.0", "2.1.0.post17", "torch==2.1.0+cpu").fatal
    assert not pairs.check("2.14.1", "2.14.0", "torch==2.14.0.*").fatal
    assert pairs.check("2.14.1", "2.14.0", "torch==2.14.0.*").declared is False
    assert pairs.check("2.14.0", "2.14.0", "torch==2.14.0.*").warning() is None
    # A build from source declares nothing: its own version names the line.
    assert pairs.check("2.14.0", "2.1.0", None).fatal


def test_the_pairing_release_comes_from_the_cached_wheels() -> None:
    new, old = _release("2.14.0"), _release("2.1.0.post17")
    assert pairs.pairing("2.14.0+cu130", [new, old]) == new
    assert pairs.pairing("2.1.0+cpu", [new, old]) == old
    assert pairs.pairing("2.1.0", [new, old]) is None


def _undeclared_pair(tmp_path: Path) -> Path:
    """A torch_npu that metadata says was built for this torch's release, as a +cpu build."""
    line = torch.__version__.split("+")[0]
    site = tmp_path / "site"
    info = site / f"torch_npu-{line}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch-npu\nVersion: {line}\n"
                                   f"Requires-Dist: torch (=={line}+cpu)\n")
    package = site / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text('raise AssertionError("env imported torch_npu")\n')
    return site


@pytest.mark.slow
def test_env_warns_about_a_pair_the_release_does_not_declare(tmp_path: Path) -> None:
    site = _undeclared_pair(tmp_path)
    result = run_cli("env", "--device", "cpu", "--json", env=child_env(site))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    line = torch.__version__.split("+")[0]
    assert report["torch_npu_requires"] == f"torch=={line}+cpu"
    assert report["torch_pair_declared"] is False
    warning = next(w for w in report["warnings"] if "a pair the release does not declare" in w)
    assert warning.endswith(f"Install the declared torch: pip install torch=={line}+cpu --index-url "
                            f"https://download.pytorch.org/whl/cpu.")


@pytest.mark.slow
def test_env_names_the_cached_release_that_pairs_with_this_torch(tmp_path: Path) -> None:
    cache = releases.cache_dir()
    found = pairs.pairing(torch.__version__)
    result = run_cli("env", "--json", env=child_env(NPU_MIGRATE_RELEASES_DIR=str(cache)))
    report = json.loads(result.stdout)
    assert report["torch_npu_version"] is None
    other = pairs.same_line(torch.__version__)
    if found is None and other is not None:  # PyPI's torch 2.1.0; 2.1.0.post17 declares the +cpu build
        assert report["torch_npu_pairing"] is None
        assert report["pairing_source"] == (
            f"none: the newest release of this line, torch-npu {other.version} (cache), declares "
            f"{other.requires_torch}; {pairs.install_torch(other.requires_torch)} to pair with it")
    elif found is None:
        assert report["torch_npu_pairing"] is None
        assert "npu-migrate env --releases" in report["pairing_source"]
    else:
        assert report["torch_npu_pairing"] == f"{found.version} ({found.requires_torch})"
        assert report["pairing_source"] == "cache"
    # Without a cache nothing is downloaded unless --releases asks for it.
    empty = run_cli("env", "--json", env=child_env(NPU_MIGRATE_RELEASES_DIR=str(tmp_path / "empty")))
    assert json.loads(empty.stdout)["torch_npu_pairing"] is None
    assert not (tmp_path / "empty").exists()



@pytest.mark.slow
def test_env_releases_downloads_the_pairing_release_once(tmp_path: Path) -> None:
    """``env --releases`` fetches with pip (here from a local folder of wheels, as a mirror would)."""
    _release("2.14.0"), _release("2.1.0.post17")
    mirror, cache = releases.cache_dir(), tmp_path / "cache"
    env = child_env(NPU_MIGRATE_RELEASES_DIR=str(cache), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(mirror))
    result = run_cli("env", "--json", "--releases", env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    line = ".".join(torch.__version__.split(".")[:2])
    fetched = sorted(
        p.name.split("-")[1] for p in cache.glob("torch_npu-*.whl"))
    assert len(fetched) == 1 and fetched[0].startswith(f"{line}.")  # the newest of torch's release line
    requires = releases.find(fetched[0], allow_download=False).requires_torch  # the same wheel, in the mirror
    if pairs.accepts(requires, torch.__version__):
        assert (report["torch_npu_pairing"], report["pairing_source"]) == (
            f"{fetched[0]} ({requires})", "downloaded")
        again = run_cli("env", "--json", env=env)  # the next run reads the cache, without --releases
        assert json.loads(again.stdout)["pairing_source"] == "cache"
    else:  # PyPI's torch 2.1.0 and torch-npu 2.1.0.post17 (+cpu): which torch pairs with the release
        assert report["torch_npu_pairing"] is None
        assert report["pairing_source"] == (
            f"none: the newest release of this line, torch-npu {fetched[0]} (downloaded), declares {requires}; "
            f"{pairs.install_torch(requires)} to pair with it")
