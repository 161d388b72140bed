#!/usr/bin/env bash
# README's second command: set up, lint, then run the tests. Arguments go to pytest, e.g. the quick
# subset: bash scripts/test.sh -n 3 -m "not slow and not netlab and not ssh and not java" --hypothesis-profile=quick
set -euo pipefail
cd "$(dirname "$0")/.."
# Let Python and pytest keep compiled modules and rewritten test modules as bytecode (gitignored
# __pycache__ folders): with PYTHONDONTWRITEBYTECODE set, as on these machines, every run compiles
# them again, and collecting the quick subset takes 10 s instead of 4.
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
# The stages never import the workflows layer or the CLI; the runtime never imports the compiler
# (pyproject.toml, [tool.importlinter]).
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
# With no arguments, the whole suite on three workers (pytest-xdist) on the two cores: the tests
# marked `measures` run alone first (tests/measuring.py holds a lock), the others side by side, a
# third worker filling the time a test waits on sockets, sshd, shaped links and the emulated board
# (README "Tests"). Pass -p no:xdist to run serially.
[ $# -gt 0 ] || set -- -n 3
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
