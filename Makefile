# The two commands a fresh machine needs are `make run` and `make test` (README).
SHELL := /bin/bash
GO    ?= go
BIN   := bin/bandplane

.PHONY: build run test test-cluster up down unit bench-ingest bench-policy bench-query fuzz generate

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

# Unit tests only: no servers needed.
unit:
	$(GO) test -count=1 ./...

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

# Regenerates the gqlgen code, the Grafana dashboards and alert rules; tests fail when any is stale
# (graph/generate_test.go, dashboards/dashboards_test.go).
generate:
	$(GO) tool gqlgen generate
	$(GO) run ./cmd/bandplane dashboards --out deploy/grafana/dashboards --alerts deploy/grafana/provisioning/alerting
	$(GO) run ./cmd/bandplane config-reference

# 60 s each: the event decoder, and the collector's HTTP handler.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime 60s ./schema/
	$(GO) test -run '^$$' -fuzz '^FuzzCollector$$' -fuzztime 60s ./ingest/
