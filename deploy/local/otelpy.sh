#!/usr/bin/env bash
# The OpenTelemetry Python SDK with OpenInference's OpenAI instrumentation, for the
# tests: a project-local virtual environment in which deploy/stacktest/otelpy/chat.py
# exports a real Python runtime's GenAI spans to `bandplane serve`
# (cmd/bandplane/otlp_python_integration_test.go). Test-only; starts nothing.
#
#   deploy/local/otelpy.sh install   # idempotent: creates .local/otelpy/venv once
#   deploy/local/otelpy.sh python    # prints the venv's python (exit 1 if not installed)
#
# The versions are pinned in otelpy-requirements.txt beside this script; pip resolves
# their own dependencies. Downloads are kept in ~/.cache/bandplane/pip, so a new checkout
# on the same machine installs without the network. A change of a pin makes the next
# install build the environment anew. Two installs at once are not guarded against (make
# test runs one).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
REQUIREMENTS="$HERE/otelpy-requirements.txt"
VENV="${BANDPLANE_OTELPY_VENV:-$ROOT/.local/otelpy/venv}"
CACHE="${BANDPLANE_CACHE:-$HOME/.cache/bandplane}/pip"
# pip's whole run, and each of its connections, is bounded: a registry that hangs fails
# the install instead of the test run waiting on it.
PIP_TIMEOUT_S=600

say() { echo "otelpy: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=venv.sh
source "$HERE/venv.sh"

# installed: every pin of the requirements file is the version installed, and the
# modules chat.py uses import.
installed() {
  [[ -x "$VENV/bin/python" ]] &&
    "$VENV/bin/python" - "$REQUIREMENTS" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if line:
        name, version = line.split("==")
        if m.version(name) != version:
            sys.exit(1)
import openai
import opentelemetry.sdk.trace
import opentelemetry.exporter.otlp.proto.http.trace_exporter
import openinference.instrumentation.openai
PY
}

install() {
  if installed; then return 0; fi
  say "creating $VENV with the OpenTelemetry SDK and OpenInference (pins: $REQUIREMENTS) ..."
  fresh_venv "$VENV" BANDPLANE_OTELPY_VENV
  mkdir -p "$CACHE"
  timeout "$PIP_TIMEOUT_S" "$VENV/bin/pip" install -q --disable-pip-version-check --no-input --prefer-binary \
    --timeout 60 --retries 3 --cache-dir "$CACHE" -r "$REQUIREMENTS" ||
    die "pip install -r $REQUIREMENTS failed (or took more than $PIP_TIMEOUT_S s)"
  installed || die "the pinned packages of $REQUIREMENTS are not importable after installing them"
  say "installed: $("$VENV/bin/python" -c 'import importlib.metadata as m; print(" ".join(n + "==" + m.version(n) for n in ("opentelemetry-sdk", "openinference-instrumentation-openai", "openai")))')"
}

case "${1:-}" in
  install) install ;;
  python) installed || die "not installed (deploy/local/otelpy.sh install)"; echo "$VENV/bin/python" ;;
  *) echo "usage: $0 install|python" >&2; exit 2 ;;
esac
