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
	var missing []string
	for _, s := range sites {
		if !covered[s] {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "corpus coverage: %d of %d calls that send SQL were not run on both engines by any corpus test:\n  %s\n",
			len(missing), len(sites), strings.Join(missing, "\n  "))
		os.Exit(1)
	}
	fmt.Printf("corpus coverage: all %d calls that send SQL in %s ran on both engines\n", len(sites), strings.Join(dual.CorpusDirs, ", "))
	os.Exit(code)
}
