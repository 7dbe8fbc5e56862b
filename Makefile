# The two commands a fresh machine needs are `make run` and `make test` (README).
SHELL := /bin/bash
GO    ?= go
BIN   := bin/bandplane

.PHONY: build run test test-cluster up down unit check bench-ingest bench-policy bench-query fuzz generate

build:
	$(GO) build -o $(BIN) ./cmd/bandplane

# Installs and starts ClickHouse and Kafka if needed, applies the schema, runs
# `bandplane serve` with a simulated workload; Ctrl-C stops what it started.
run: build
	deploy/local/with-deps.sh deploy/local/run.sh

# Starts what the tests need, runs gofmt/vet and all tests, stops what it started.
test:
	deploy/local/with-deps.sh deploy/local/test.sh

# The cluster tests: starts ZooKeeper, four ClickHouse servers (2 shards x 2 replicas) and
# three Kafka brokers if needed, runs the TestIntegrationCluster* tests and the query tests
# on the cluster, stops what it started.
test-cluster:
	deploy/local/test-cluster.sh

# Dependencies only, for development and benchmarks.
up:
	deploy/local/deps.sh up
down:
	deploy/local/deps.sh down

# Unit tests only: no servers needed. -short runs the policy differential test on a
# tenth of its directories; `make test` runs it whole.
unit:
	$(GO) test -short -count=1 ./...

# What needs no server: gofmt, go vet, golangci-lint (.golangci.yml; golangci-lint.mod
# pins its version), and `make generate` must change nothing. In a clean clone that is
# `git diff --exit-code` after generating; comparing the work tree before and after
# lets it run on uncommitted work too.
check:
	@unformatted=$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*' -not -path './.local/*' -not -path './bin/*')); \
	if [[ -n "$$unformatted" ]]; then echo "check: gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool -modfile=golangci-lint.mod golangci-lint run ./...
	@state() { git status --porcelain --untracked-files=all; git diff; }; \
	before=$$(state | sha256sum); \
	$(MAKE) --no-print-directory generate; \
	if [[ "$$(state | sha256sum)" != "$$before" ]]; then \
	  echo "check: make generate changed the work tree: commit what it writes"; git status --short; exit 1; \
	fi

bench-ingest: build
	$(BIN) bench ingest --events 1000000

# In process, over HTTP without audit, and over HTTP with each decision audited to
# Kafka, in one run (needs `make up`).
bench-policy: build
	$(BIN) bench policy --audit

# 10M simulated events over 30 days, loaded once into their own database and reused;
# costs and an audit page through GraphQL and through the Querier, and 1,000 WebSocket
# subscribers at 20 changes/s (needs `make up`).
bench-query: build
	$(BIN) bench query

# Regenerates the gqlgen code, the Grafana dashboards and alert rules, and the configuration
# reference; `make check` fails when any is stale.
generate:
	$(GO) tool gqlgen generate
	$(GO) run ./cmd/bandplane dashboards --out deploy/grafana/dashboards --alerts deploy/grafana/provisioning/alerting
	$(GO) run ./cmd/bandplane config-reference

# 60 s each: the event decoder, and the collector's HTTP handler.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime 60s ./schema/
	$(GO) test -run '^$$' -fuzz '^FuzzCollector$$' -fuzztime 60s ./ingest/
