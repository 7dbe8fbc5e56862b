#!/usr/bin/env bash
# `make test`: with the local ClickHouse and Kafka up (make wraps this in with-deps.sh),
# vets the code and runs every test, unit and integration. The outage tests stop and
# restart the shared ClickHouse, so they run on their own, after everything else.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.local/*'))
if [[ -n "$unformatted" ]]; then
  echo "test: gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
# The live work board's test drives a headless Chromium; the two-engine tests
# (deploy/stacktest/dual) run ClickHouse 26.9 in process from a project-local venv, and
# the OTLP test of a Python runtime (OpenTelemetry SDK, OpenInference) runs from another.
"$(dirname "${BASH_SOURCE[0]}")/chromium.sh" install
"$(dirname "${BASH_SOURCE[0]}")/chdb.sh" install
"$(dirname "${BASH_SOURCE[0]}")/otelpy.sh" install
export BANDPLANE_INTEGRATION=1
go test -count=1 -timeout 30m ./...
BANDPLANE_OUTAGE_TESTS=1 go test -count=1 -timeout 20m -run 'TestIntegrationOutage' -v ./ingest/
