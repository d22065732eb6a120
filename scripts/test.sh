#!/usr/bin/env bash
# Install signoff with its test extras into .venv, check style and types, run the tests.
#   usage: bash scripts/test.sh [pytest args]   (two test processes: SIGNOFF_TEST_WORKERS)
# Postgres and Redis: the machine's (127.0.0.1:5432 db "test", 127.0.0.1:6379) when they
# answer, otherwise embedded servers started from wheels (tests/services.py).
# SIGNOFF_TEST_PGBOUNCER=1: every test database through a PgBouncer in transaction mode.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

# Browser tests drive Debian's Chromium through Playwright (no browser download).
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "test.sh: installing chromium from Debian's packages" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "test.sh: could not install chromium; browser tests will fail" >&2
fi

# PgBouncer (SIGNOFF_TEST_PGBOUNCER=1 runs the suite through it, tests/pgbouncer.py) and
# redis-server/redis-cli (the local Redis Cluster of tests/rediscluster.py): Debian's.
missing=""
[ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null || missing="$missing pgbouncer"
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing="$missing redis-server redis-tools"
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "test.sh: installing$missing from Debian's packages" >&2
  # shellcheck disable=SC2086
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null) \
    || echo "test.sh: could not install$missing; cluster or PgBouncer tests will fail" >&2
fi

# Style and types first (seconds): ruff + mypy strict, as STYLE asks.
# SIGNOFF_SKIP_LINT=1 skips them for a quick local run of a few tests.
if [ "${SIGNOFF_SKIP_LINT:-0}" != 1 ]; then
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  .venv/bin/mypy
fi

# Two test processes (the machines have two cores), each test file whole on one of them
# (--dist loadfile: a module's fixtures and order as in a serial run; each process has its
# own database, key prefixes, ports and embedded servers). Starting them costs ~6 s, so
# a run of named files or tests (a .py path, a ::test id) stays in this process, as does
# SIGNOFF_TEST_WORKERS=0 (for --pdb or -s); -n in the arguments wins.
workers=${SIGNOFF_TEST_WORKERS:-2}
for arg in "$@"; do
  case "$arg" in
    -n | -n[0-9]* | --numprocesses* | *.py | *.py::*) workers=0 ;;
  esac
done
parallel=()
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist loadfile)

set +e
.venv/bin/python -m pytest "${parallel[@]}" "$@"
code=$?
set -e
if [ "$code" = 5 ]; then
  echo "test.sh: pytest collected no tests (tests marked slow run only with -m slow:" \
    "bash scripts/test.sh -m slow <path>)" >&2
  exit 1
fi
exit "$code"
