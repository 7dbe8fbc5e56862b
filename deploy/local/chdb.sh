#!/usr/bin/env bash
# ClickHouse 26.9 for the tests: the `chdb-core` package from PyPI (ClickHouse as an
# in-process engine, no server; the only current ClickHouse these machines can get) in
# a project-local virtual environment, used by deploy/stacktest/dual to run bandplane's
# SQL on a current release beside the 18.16 server. Test-only; starts nothing.
#
#   deploy/local/chdb.sh install   # idempotent: creates .local/chdb/venv once
#   deploy/local/chdb.sh python    # prints the venv's python (exit 1 if not installed)
#
# The wheel (180 MB) is kept in ~/.cache/bandplane/pip, so a new checkout on the same
# machine installs without downloading it again. Two installs at once are not guarded
# against (make test runs one). Only chdb-core itself is installed
# (--no-deps): the engine needs none of its optional pandas/pyarrow dependencies.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VERSION="26.9.0"
VENV="${BANDPLANE_CHDB_VENV:-$ROOT/.local/chdb/venv}"
CACHE="${BANDPLANE_CACHE:-$HOME/.cache/bandplane}/pip"

say() { echo "chdb: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=venv.sh
source "$HERE/venv.sh"

installed() {
  [[ -x "$VENV/bin/python" ]] &&
    "$VENV/bin/python" -c "import importlib.metadata as m, sys, chdb; sys.exit(m.version('chdb-core') != '$VERSION')" 2>/dev/null
}

install() {
  if installed; then return 0; fi
  say "creating $VENV with chdb-core $VERSION (ClickHouse 26.9) ..."
  fresh_venv "$VENV" BANDPLANE_CHDB_VENV
  mkdir -p "$CACHE"
  # The wheel itself is kept (pip's own cache does not keep one this large), so a new
  # checkout installs it without the network.
  if ! compgen -G "$CACHE/chdb_core-$VERSION-*.whl" >/dev/null; then
    "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$CACHE" "chdb-core==$VERSION" ||
      die "pip download chdb-core==$VERSION failed"
  fi
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$CACHE" --no-deps "chdb-core==$VERSION" ||
    die "pip install chdb-core==$VERSION (from $CACHE) failed"
  installed || die "chdb-core $VERSION is not importable after installing it"
  say "engine $("$VENV/bin/python" -c 'import chdb; print(chdb.query("SELECT version()", "TabSeparated").bytes().decode().strip())')"
}

case "${1:-}" in
  install) install ;;
  python) installed || die "not installed (deploy/local/chdb.sh install)"; echo "$VENV/bin/python" ;;
  *) echo "usage: $0 install|python" >&2; exit 2 ;;
esac
