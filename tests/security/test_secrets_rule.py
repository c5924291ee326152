"""The one rule that says what a secret is (npu_migrate.redact): every form it hides, and what it leaves alone."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv, expected", [
    (["--api-key", "abc123"], ["--api-key", "***"]),
    (["--api-key=abc123"], ["--api-key=***"]),
    (["--wandb_api_key", "abc123", "--lr", "0.1"], ["--wandb_api_key", "***", "--lr", "0.1"]),
    (["--apiKey", "abc123"], ["--apiKey", "***"]),
    (["--auth-token", "t", "--password", "p", "--client-secret", "s", "--credentials", "c", "--auth", "a"],
     ["--auth-token", "***", "--password", "***", "--client-secret", "***", "--credentials", "***", "--auth", "***"]),
    (["HF_TOKEN=abc", "db.password=hunter2", "+wandb.api_key=x", "AWS_ACCESS_KEY_ID=AKIA1"],
     ["HF_TOKEN=***", "db.password=***", "+wandb.api_key=***", "AWS_ACCESS_KEY_ID=***"]),
    (["--db-url", "postgres://u:pass@h:5432/db"], ["--db-url", "postgres://***@h:5432/db"]),
    (["--db-url=mysql://root@h/db"], ["--db-url=mysql://***@h/db"]),
    (["--token", "--verbose"], ["--token", "--verbose"]),                       # a flag without a value
    # names that only look alike keep their values
    (["--max-tokens", "512", "--tokenizer", "gpt2", "--num-keys", "3", "--lr", "-1e-3", "x=1"],
     ["--max-tokens", "512", "--tokenizer", "gpt2", "--num-keys", "3", "--lr", "-1e-3", "x=1"]),
])
def test_argv(argv: list[str], expected: list[str]) -> None:
    from npu_migrate import redact

    assert redact.argv(["train.py", *argv], environ={}) == ["train.py", *expected]


@pytest.mark.parametrize("text, expected", [
    ("login failed: password=hunter2 for u", "login failed: password=*** for u"),
    ("password: hunter2", "password: ***"),
    ('{"api_key": "abc", "lr": 1}', '{"api_key": ***, "lr": 1}'),
    ("GET https://h/x?api_key=abc&page=2", "GET https://h/x?api_key=***&page=2"),
    ("Authorization: Bearer eyJabc.def", "Authorization: ***"),
    ("run with --api-key abc now", "run with --api-key *** now"),
    ("connect to redis://:pw@cache:6379/0 failed", "connect to redis://***@cache:6379/0 failed"),
    ("KeyError: 'weight'", "KeyError: 'weight'"),
    ("the token expired; max_tokens=512", "the token expired; max_tokens=512"),
])
def test_text(text: str, expected: str) -> None:
    from npu_migrate import redact

    assert redact.text(text, environ={}) == expected


def test_values_of_secret_variables_are_hidden_wherever_they_appear() -> None:
    from npu_migrate import redact

    environ = {"WANDB_API_KEY": "sekrit-value-1", "MYSQL_PWD": "pw-value-2", "USE_AUTH": "true",
               "PATH": "/usr/bin", "GITHUB_TOKEN": "abc"}
    text = "the server said sekrit-value-1 is wrong, tried pw-value-2; true /usr/bin abc"
    assert redact.text(text, environ) == "the server said *** is wrong, tried ***; true /usr/bin abc"
    record = {"argv": ["x"], "password": "p", "nested": [{"token": "t", "enabled": True}], "lr": 0.1}
    assert redact.value(record, environ={}) == {"argv": ["x"], "password": "***",
                                                "nested": [{"token": "***", "enabled": True}], "lr": 0.1}
