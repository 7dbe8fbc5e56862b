// Package layers keeps the repository's floors as a test: which top-level folder may
// import which, so that the data flow reads from the imports. It holds no code of its
// own; `go test ./deploy/layers/ -v` also lists each folder's hand-written lines.
//
// It may import nothing of the module (deploy/layers): its tests read the module with
// go list.
//
// The floors, from the bottom:
//
//  0. schema/: the basement every user shares: the event contract, ClickHouse's
//     schema, migrations and store, the Kafka client, API keys and their middleware,
//     pricing, and the transparency log's data model (tlog).
//  1. ingest/, policy/, query/: the pipeline, governance, and the readers (with the
//     audit trail's sealing, verification and export). None imports another.
//  2. graph/, dashboards/: the API and the dashboards, over the floors below.
//  3. deploy/: what runs and loads a deployment: the simulator, the benchmarks, the
//     stack tests.
//  4. cmd/: the binary, which wires everything.
//
// A package may import its own folder's packages and any floor below its own; tests
// may import anything (deploy/stacktest's fixtures, the simulator).
package layers
