package dual_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/deploy/stacktest/dual"
)

// emptyOK are the calls whose results are empty on any data the corpus can make, by
// design, with the reason.
var emptyOK = map[string]string{
	"query/trail/cut.go:117": "the days of events before a signed retention cut: retention drops them before it records the cut, so only a drop that failed half-way leaves rows",
	"query/trail/db.go:15":   "SELECT now(): the server's clock, compared by its column only",
}

// clusterOnly are the files whose SQL runs only on a ClickHouse cluster (DDL ON CLUSTER,
// system.clusters, remote() over every server), which neither engine of the corpus is:
// `make test-cluster` runs them on deploy/local/cluster.sh's 18.16 cluster. What they
// make is the same tables the corpus compares (Replicated engines and Distributed
// tables hold the same columns and rows).
var clusterOnly = map[string]string{
	"schema/chdb/cluster.go": "cluster DDL and system tables: ON CLUSTER needs ZooKeeper and remote_servers",
}

// TestMain checks, after a full integration run of the corpus tests (no -run filter),
// that they made every SQL-sending call of the corpus packages through a Recorder: a
// query nobody compares on both engines fails the package.
func TestMain(m *testing.M) {
	code := m.Run()
	if code != 0 || os.Getenv("BANDPLANE_INTEGRATION") != "1" || flag.Lookup("test.run").Value.String() != "" {
		os.Exit(code)
	}
	sites, err := dual.CallSites(stacktest.RepoRoot(), dual.CorpusDirs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "corpus coverage:", err)
		os.Exit(1)
	}
	covered := dual.Covered()
	var missing, empty []string
	for _, s := range sites {
		rows, ok := covered[s]
		file, _, _ := strings.Cut(s, ":")
		switch {
		case !ok && clusterOnly[file] != "":
		case !ok:
			missing = append(missing, s)
		case !rows && emptyOK[s] == "":
			empty = append(empty, s)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "corpus coverage: %d of %d calls that send SQL were not compared on both engines by any corpus test:\n  %s\n",
			len(missing), len(sites), strings.Join(missing, "\n  "))
	}
	if len(empty) > 0 {
		fmt.Fprintf(os.Stderr, "corpus coverage: %d calls were compared on both engines only on empty results (give the corpus data they return, or list them in emptyOK with the reason):\n  %s\n",
			len(empty), strings.Join(empty, "\n  "))
	}
	if len(missing)+len(empty) > 0 {
		os.Exit(1)
	}
	fmt.Printf("corpus coverage: all %d calls that send SQL in %s ran on both engines\n", len(sites), strings.Join(dual.CorpusDirs, ", "))
	os.Exit(code)
}
