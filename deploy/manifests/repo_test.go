package manifests

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// serveDefaultPartitions is serve's --partitions default: the partitions of the events
// topic when serve creates it.
const serveDefaultPartitions = 4

// program is what cmd/bandplane reads: its BANDPLANE_* variables and its flag names,
// taken from the Go sources (not the tests), so that a renamed variable or flag fails
// here instead of being ignored by a deployment.
type program struct {
	env   map[string]bool
	flags map[string]bool
}

var (
	envLiteral = regexp.MustCompile(`"(BANDPLANE_[A-Z0-9_]+)"`)
	// fs.StringVar(&c.listen, "listen", …), fs.Bool("dry-run", …), fs.Var(&v, "name", …)
	flagLiteral = regexp.MustCompile(`\bfs\.[A-Z]\w*\(\s*(?:&?[\w.\[\]]+\s*,\s*)?"([a-z][a-z0-9-]*)"`)
)

func readProgram(t *testing.T, root string) program {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "cmd", "bandplane", "*.go"))
	require.NoError(t, err)
	p := program{env: map[string]bool{}, flags: map[string]bool{}}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range envLiteral.FindAllSubmatch(b, -1) {
			p.env[string(m[1])] = true
		}
		for _, m := range flagLiteral.FindAllSubmatch(b, -1) {
			p.flags[string(m[1])] = true
		}
	}
	// What the sources are known to hold: if these are missing, the patterns broke.
	require.True(t, p.env["BANDPLANE_CLICKHOUSE_PASSWORD"], "no BANDPLANE_CLICKHOUSE_PASSWORD found in cmd/bandplane: the pattern no longer matches how variables are read")
	require.True(t, p.flags["metrics-listen"] && p.flags["partitions"], "no --metrics-listen/--partitions found in cmd/bandplane: the pattern no longer matches how flags are registered")
	return p
}

// envProblem says what is wrong with a variable a manifest sets, or "".
func (p program) envProblem(name string) string {
	if !strings.HasPrefix(name, "BANDPLANE_") || p.env[name] {
		return ""
	}
	return name + " is not a variable cmd/bandplane reads"
}

// flagProblems says which --flags of an argument list bandplane does not define.
func (p program) flagProblems(args []string) []string {
	var out []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !p.flags[name] {
			out = append(out, "flag "+a+" is not a flag cmd/bandplane defines")
		}
	}
	return out
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, "go.mod"))
	return root
}

// readTree returns every regular file below dir by its slash-separated relative path.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		files[filepath.ToSlash(rel)] = b
		return err
	}))
	return files
}

// mutate returns a copy of files with old replaced by new, once, in file name; the
// hostile tests use it to break one thing at a time.
func mutate(t *testing.T, files map[string][]byte, name, old, new string) map[string][]byte {
	t.Helper()
	out := make(map[string][]byte, len(files))
	for k, v := range files {
		out[k] = v
	}
	b, ok := files[name]
	require.True(t, ok, "no file %s", name)
	require.Equal(t, 1, bytes.Count(b, []byte(old)), "%q must occur exactly once in %s", old, name)
	out[name] = bytes.Replace(b, []byte(old), []byte(new), 1)
	return out
}

// ignoresAll says whether a .gitignore in dir keeps every file of dir out of git (but
// itself): where secrets live.
func ignoresAll(t *testing.T, files map[string][]byte, dir string) bool {
	t.Helper()
	gi, ok := files[dir+"/.gitignore"]
	if !ok {
		return false
	}
	for _, l := range strings.Split(string(gi), "\n") {
		if strings.TrimSpace(l) == "*" {
			return true
		}
	}
	return false
}

// goDirective returns go.mod's go version as numbers.
func goDirective(t *testing.T, root string) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^go (\d+(?:\.\d+)*)\s*$`).FindSubmatch(b)
	require.NotNil(t, m, "go.mod has no go directive")
	return versionNumbers(string(m[1]))
}

func versionNumbers(v string) []int {
	var out []int
	for _, p := range strings.Split(v, ".") {
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil
		}
		out = append(out, n)
	}
	return out
}

// versionAtLeast compares dotted versions, a missing part counting as 0.
func versionAtLeast(have, want []int) bool {
	for i := 0; i < len(have) || i < len(want); i++ {
		var h, w int
		if i < len(have) {
			h = have[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if h != w {
			return h > w
		}
	}
	return true
}

// imageProblem says what is wrong with an image reference, or "": it must name a tag
// (or a digest), never latest; a pulled image's tag must be a version.
func imageProblem(ref string, built bool) string {
	name, digest, _ := strings.Cut(ref, "@")
	if digest != "" {
		return ""
	}
	slash := strings.LastIndex(name, "/")
	colon := strings.LastIndex(name, ":")
	if colon <= slash {
		return "image " + ref + " names no tag (it would pull latest)"
	}
	tag := name[colon+1:]
	switch {
	case tag == "latest":
		return "image " + ref + " is tagged latest: pin a version"
	case !built && (tag[0] < '0' || tag[0] > '9'):
		return "image " + ref + " is not pinned to a version tag"
	}
	return ""
}

// listenPort is the port of a host:port listen address.
func listenPort(addr string) string {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return ""
	}
	return addr[i+1:]
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// secretLooking finds what should never be committed in a manifest: an API token or a
// private key.
var secretLooking = regexp.MustCompile(`bpk_[A-Za-z0-9_-]{8,}|-----BEGIN [A-Z ]*PRIVATE KEY-----`)

func TestImageProblem(t *testing.T) {
	for _, c := range []struct {
		ref   string
		built bool
		ok    bool
	}{
		{"apache/kafka:4.4.0", false, true},
		{"localhost:5000/kafka", false, false},
		{"grafana/grafana", false, false},
		{"grafana/grafana:latest", false, false},
		{"grafana/grafana:main", false, false},
		{"bandplane:compose", true, true},
		{"bandplane:latest", true, false},
		{"alpine@sha256:0123", false, true},
	} {
		require.Equal(t, c.ok, imageProblem(c.ref, c.built) == "", c.ref)
	}
}

func TestVersionAtLeast(t *testing.T) {
	require.True(t, versionAtLeast([]int{1, 26, 8}, []int{1, 26, 8}))
	require.True(t, versionAtLeast([]int{1, 27}, []int{1, 26, 8}))
	require.False(t, versionAtLeast([]int{1, 26, 7}, []int{1, 26, 8}))
	require.False(t, versionAtLeast([]int{1, 26}, []int{1, 26, 1}))
}
