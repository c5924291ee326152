"""The documents tell the truth: their commands parse, their tables are complete, their links resolve.

What is checked, in README.md, CONTRIBUTING.md, docs/*.md and examples/README.md:

* every command in a ```bash block that runs npu_migrate (``npu-migrate ...``,
  ``python -m npu_migrate ...``, ``python -m npu_migrate.launch ...``) names a real sub-command and
  only flags its parser accepts, spelled out (no abbreviations); the parsers are built in this
  process from :func:`npu_migrate.cli.build_parser`, once each, and nothing is run;
* every ``NPU_MIGRATE_*`` variable named in npu_migrate/ has a row in docs/architecture.md's table,
  and the table has no row for a variable the code no longer names;
* every relative link in README.md, CONTRIBUTING.md and docs/*.md points to a file that exists,
  and a ``#fragment`` to one of its headings;
* CONTRIBUTING.md's set-up commands are the README's two, as written there;
* README.md stays a first page (at most 160 lines), and no user document cites an issue number,
  a seed file or one machine's absolute path.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
from pathlib import Path

import pytest

from npu_migrate import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
USER_DOCUMENTS = [README, CONTRIBUTING, *DOCS, ROOT / "examples" / "README.md"]
LINKED_DOCUMENTS = [README, CONTRIBUTING, *DOCS]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README_MAX_LINES = 160

VARIABLE = re.compile(r"NPU_MIGRATE_[A-Z0-9_]+")
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
FENCED = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
SEPARATORS = {"&&", "||", "|", ";", "&", "(", ")"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Entry points reached with `python -m MODULE`, and the parser each one uses.
MODULES = {"npu_migrate": None, "npu_migrate.launch": "launch", "npu_migrate.compare": "compare"}


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --------------------------------------------------------------------------- commands


def _commands(text: str) -> list[list[str]]:
    """The simple commands of every ```bash block: words, split at pipes, lists and subshells."""
    commands = []
    for block in BASH_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words: list[str] = []
            for word in [*lexer, ";"]:
                if word in SEPARATORS:
                    if words:
                        commands.append(words)
                    words = []
                else:
                    words.append(word)
    return commands


def _npu_migrate_argv(words: list[str]) -> tuple[str | None, list[str]] | None:
    """``(entry, argv)`` where ``words`` runs npu_migrate (``entry`` None: the root command), else None."""
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words:
        return None
    if words[0] == "npu-migrate":
        return None, words[1:]
    program = words[0].rsplit("/", 1)[-1]
    if re.fullmatch(r"python(3(\.\d+)?)?", program) and len(words) > 2 and words[1] == "-m":
        module = words[2]
        if module == "npu_migrate" or module.startswith("npu_migrate."):
            return MODULES.get(module, f"python -m {module}"), words[3:]
    return None


def _documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in USER_DOCUMENTS:
        for words in _commands(path.read_text()):
            if _npu_migrate_argv(words) is not None:
                found.append((_name(path), words))
    return found


@functools.lru_cache(maxsize=None)
def _parser(command: str | None) -> argparse.ArgumentParser:
    """The root parser (``command`` None) or the parser of one sub-command, built once."""
    root = cli.build_parser(cli._BY_NAME[command] if command else None)
    if command is None:
        return root
    (subparsers,) = [a for a in root._actions if isinstance(a, argparse._SubParsersAction)]
    return subparsers.choices[command]


def _values_taken(action: argparse.Action, rest: list[str]) -> int:
    """How many of the next words an option consumes."""
    nargs = action.nargs
    if nargs == 0:
        return 0
    if nargs is None:
        return 1
    if isinstance(nargs, int):
        return nargs
    if nargs == "?":
        return 1 if rest and not rest[0].startswith("-") else 0
    taken = 0
    while taken < len(rest) and not rest[taken].startswith("-"):
        taken += 1
    return taken


def _check_flags(parser: argparse.ArgumentParser, argv: list[str], where: str) -> None:
    """Every option in ``argv`` is one ``parser`` accepts, up to the script whose arguments follow."""
    options = parser._option_string_actions
    stops_at_script = any(a.nargs == argparse.REMAINDER for a in parser._actions)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return
        if word.startswith("-") and word != "-" and not re.fullmatch(r"-\d+(\.\d+)?", word):
            name, equals, _ = word.partition("=")
            action = options.get(name)
            if action is None and not name.startswith("--") and name[:2] in options:
                action, equals = options[name[:2]], "="  # -j4: the value is attached
            assert action is not None, (
                f"{where}: {parser.prog} has no option {name!r}; it takes "
                f"{', '.join(sorted(o for o in options if o.startswith('--')))}")
            i += 1 + (0 if equals else _values_taken(action, argv[i + 1:]))
            continue
        if stops_at_script:
            return  # the script; what follows is its own
        i += 1


def _check_command(entry: str | None, argv: list[str], where: str) -> None:
    assert entry is None or not entry.startswith("python -m"), (
        f"{where}: `{entry}` is not an entry point; expected one of {', '.join(MODULES)}")
    if entry is not None:
        _check_flags(_parser(entry), argv, where)
        return
    root = _parser(None)
    for i, word in enumerate(argv):
        if word.startswith("-"):
            assert word in root._option_string_actions, f"{where}: npu-migrate has no option {word!r}"
            if word in ("--help", "-h", "--version"):
                return
            continue
        names = [c.name for c in cli.COMMANDS]
        assert word in names, f"{where}: {word!r} is not a sub-command; expected one of {', '.join(names)}"
        _check_flags(_parser(word), argv[i + 1:], where)
        return
    pytest.fail(f"{where}: npu-migrate without a sub-command")


def test_the_documents_show_commands() -> None:
    """The extraction finds the commands it is meant to check (an empty list would pass anything)."""
    found = _documented_commands()
    kinds = {(_npu_migrate_argv(words) or (None, []))[0] for _, words in found}
    assert {None, "launch"} <= kinds
    assert any(where == "README.md" for where, _ in found)
    assert len(found) >= 20, found


@pytest.mark.parametrize("where,words", _documented_commands(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_every_documented_command_parses(where: str, words: list[str]) -> None:
    entry, argv = _npu_migrate_argv(words)  # type: ignore[misc]
    _check_command(entry, argv, f"{where}: `{' '.join(words)}`")


def test_the_flag_check_refuses_what_argparse_refuses() -> None:
    """The checker itself: an unknown flag, an unknown sub-command and an abbreviation fail."""
    for words in (["npu-migrate", "port", "src/", "--output", "x"], ["npu-migrate", "porting", "src/"],
                  ["python", "-m", "npu_migrate.launch", "--device-n", "2", "train.py"]):
        entry, argv = _npu_migrate_argv(words)  # type: ignore[misc]
        with pytest.raises(AssertionError):
            _check_command(entry, argv, "self-test")
    # The script's own flags are the script's.
    _check_command("launch", ["--device-num", "2", "train.py", "--epochs", "3", "--no-such"], "self-test")


# --------------------------------------------------------------------------- variables


def _variables_in_code() -> set[str]:
    return {m for path in (ROOT / "npu_migrate").rglob("*.py") for m in VARIABLE.findall(path.read_text())}


def _variables_in_table() -> set[str]:
    text = ARCHITECTURE.read_text()
    section = text.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(NPU_MIGRATE_[A-Z0-9_]+)` \|", section, re.M))


def test_every_variable_the_code_reads_is_in_the_architecture_table() -> None:
    code, table = _variables_in_code(), _variables_in_table()
    assert len(code) > 20
    assert not code - table, f"add a row to docs/architecture.md's Environment variables: {sorted(code - table)}"
    assert not table - code, f"docs/architecture.md lists variables no module names: {sorted(table - code)}"


# --------------------------------------------------------------------------- links


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def _anchors(path: Path) -> frozenset[str]:
    text = FENCED.sub("", path.read_text())
    return frozenset(_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M))


@pytest.mark.parametrize("document", LINKED_DOCUMENTS, ids=_name)
def test_every_relative_link_resolves(document: Path) -> None:
    text = INLINE_CODE.sub("", FENCED.sub("", document.read_text()))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file, _, fragment = target.partition("#")
        path = (document.parent / file).resolve() if file else document
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
            broken.append(f"{target} (no heading #{fragment} in {path.name})")
    assert not broken, f"{_name(document)}: {broken}"


# --------------------------------------------------------------------------- first page and wording


def test_contributing_sets_up_with_the_readmes_two_commands() -> None:
    readme = README.read_text()
    commands = BASH_BLOCK.search(readme, readme.index("<!-- ci:commands")).group(1)
    assert BASH_BLOCK.search(CONTRIBUTING.read_text()).group(1) == commands, (
        "CONTRIBUTING.md's first bash block must be the README's ci:commands block, as written there")


def test_readme_is_a_first_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


@pytest.mark.parametrize("document", [*USER_DOCUMENTS, ROOT / "tests" / "corpus" / "README.md"], ids=_name)
def test_no_issue_numbers_seed_names_or_machine_paths(document: Path) -> None:
    text = document.read_text()
    cited = re.findall(r"\bissues? #?\d+\b|\bseeds? 0\d\d\b|\bseed0\d\d\b", text, re.I)
    assert not cited, f"{_name(document)} cites {cited}: describe the pattern instead"
    paths = re.findall(r"(?<![\w.$~])/(?:work|home|root|Users)/\S*", text)
    assert not paths, f"{_name(document)} names one machine's paths: {paths}"
