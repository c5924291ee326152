"""No secrets in recordings or reports: the one rule that says what a secret looks like, and hides it.

Usage::

    from npu_migrate import redact

    redact.argv(["train.py", "--api-key", "abc", "--db=postgres://u:pw@h/db"])
    # ['train.py', '--api-key', '***', '--db=postgres://***@h/db']
    redact.text("login failed: password=hunter2")      # 'login failed: password=***'
    redact.value(record)                                # every string in a dict/list, recursively

What counts as secret (probe headers, migrate reports and the launcher's error files all go
through here, so the rule lives in one place):

* the value of an argument or variable whose **name says** key, token, secret, password
  (passwd, pwd, pass), credential(s) or auth (authorization, authentication): the name is split
  at ``-``, ``_``, ``.`` and camelCase and its *last* part is looked at, so ``--wandb-api-key``,
  ``HF_TOKEN``, ``PGPASSWORD``, ``db.password`` and ``AWS_ACCESS_KEY_ID`` (``..._KEY_ID``) are
  secret, while ``--max-tokens``, ``--tokenizer`` and ``KeyError`` are not. Forms:
  ``--name VALUE``, ``--name=VALUE``, ``NAME=VALUE``, ``name: VALUE`` and dict keys;
* the **userinfo of a URL**: ``postgres://u:pass@h`` becomes ``postgres://***@h``;
* the **values** of such variables in this process's environment, wherever they appear in text
  (a message that quotes ``$WANDB_API_KEY``), when at least :data:`MIN_SECRET_LEN` long.

Redaction errs on the side of hiding: ``--sort-key name`` loses its value too.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping

MASK = "***"

MIN_SECRET_LEN = 6
"""Environment values shorter than this are not searched for in text: ``1`` or ``true`` in a
variable named ``..._AUTH`` would otherwise blank every ``1`` of a message; real keys are longer."""

_SENSITIVE_PART = re.compile(
    r"^(?:.*key|.*token|.*secret|.*passw(?:or)?d|pwd|pass|.*credentials?|auth|authn|authz|"
    r"authorization|authentication|.*authtoken|cookie)$")
_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+")
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/@'\"<>]+)@")
_NOT_SECRET_VALUES = frozenset({"true", "false", "yes", "no", "none", "null", "on", "off"})

# In text: ``--name VALUE``/``--name=VALUE`` (options), ``name=VALUE`` and ``name: VALUE``
# (optionally quoted, as in JSON or a repr). Whether ``name`` is secret is decided by
# is_secret_name, not by the expression.
_TEXT_PAIR = re.compile(
    r"""(?P<head>(?P<dash>--?)?(?P<q1>["']?)(?P<name>[A-Za-z_][\w.\-]*)(?P=q1))"""
    r"""(?P<sep>\s*[=:]\s*|(?(dash)\s+|(?!)))"""
    r"""(?P<value>(?:(?:Bearer|Basic|Token|Digest)\s+)?(?:"[^"]*"|'[^']*'|[^\s,;&'")\]}]+))""")


def name_parts(name: str) -> list[str]:
    """``--wandb-api-key`` -> ``['wandb', 'api', 'key']``; ``apiKey`` -> ``['api', 'key']``."""
    return [p.lower() for p in _PARTS.findall(name.lstrip("-+"))]


def is_secret_name(name: str) -> bool:
    """True when the value of an argument or variable called ``name`` must not be recorded."""
    parts = name_parts(name)
    if not parts:
        return False
    if _SENSITIVE_PART.match(parts[-1]):
        return True
    # AWS_ACCESS_KEY_ID, OSS_ACCESS_KEY_ID, api_key_id: an identifier of a key, shown nowhere either
    return parts[-1] == "id" and len(parts) > 1 and bool(_SENSITIVE_PART.match(parts[-2]))


def secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the environment's secret-named variables worth searching for, longest first."""
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN
             and v.strip().lower() not in _NOT_SECRET_VALUES}
    return sorted(found, key=len, reverse=True)


def url_userinfo(text: str) -> str:
    """``scheme://user:pass@host`` -> ``scheme://***@host`` everywhere in ``text``."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def _pairs(value: str) -> str:
    """Hide the values of secret-named pairs; a pair that is not secret is passed by its name only,
    so ``https://h/x?api_key=abc`` still has its ``api_key`` looked at."""
    out, pos = [], 0
    while True:
        match = _TEXT_PAIR.search(value, pos)
        if match is None:
            out.append(value[pos:])
            return "".join(out)
        if is_secret_name(match.group("name")) and match.group("value") != MASK:
            out.append(value[pos:match.start()])
            out.append(f"{match.group('head')}{match.group('sep')}{MASK}")
            pos = match.end()
        else:
            out.append(value[pos:match.end("head")])
            pos = match.end("head")


def text(value: str, environ: Mapping[str, str] | None = None) -> str:
    """``value`` with every secret the module docstring describes replaced by ``***``."""
    if not value:
        return value
    for secret in secret_env_values(environ):
        value = value.replace(secret, MASK)
    value = url_userinfo(value)
    return _pairs(value)


def argv(args: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """A command line as it may be recorded: ``--api-key X`` and ``--api-key=X`` lose ``X``."""
    out: list[str] = []
    hide_next = False
    for arg in (str(a) for a in args):
        if hide_next and not (arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit()):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        name, eq, _ = arg.partition("=")
        if eq and is_secret_name(name) and re.fullmatch(r"[-+]*[A-Za-z_][\w.\-/+]*", name):
            out.append(f"{name}={MASK}")
            continue
        if arg.startswith("-") and not eq and is_secret_name(arg):
            hide_next = True
        out.append(text(arg, environ))
    return out


def value(obj: Any, environ: Mapping[str, str] | None = None) -> Any:
    """``obj`` (dicts, lists, tuples, strings) with secrets hidden; dict values under secret keys too."""
    if isinstance(obj, str):
        return text(obj, environ)
    if isinstance(obj, Mapping):
        return {k: (MASK if isinstance(k, str) and is_secret_name(k) and v not in (None, "", [], {})
                    and not isinstance(v, bool) else value(v, environ)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(value(v, environ) for v in obj) if isinstance(obj, list) else \
            tuple(value(v, environ) for v in obj)
    return obj
