"""``python -m npu_migrate SUBCOMMAND`` does what ``npu-migrate SUBCOMMAND`` does."""

from npu_migrate.cli import main

raise SystemExit(main())
