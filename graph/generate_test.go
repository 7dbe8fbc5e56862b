package graph_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedCodeIsCurrent regenerates the gqlgen code in a copy of the repository
// (`go tool gqlgen generate`, as `make generate` does) and fails when the committed
// files differ: the schema changed without regenerating, or generated code was edited.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("regenerates with gqlgen (about 20 s)")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case ".git", ".local", "bin":
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(tmp, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(tmp, rel), b, 0o644)
	})
	if err != nil {
		t.Fatalf("cannot copy the repository: %v", err)
	}
	cmd := exec.Command("go", "tool", "gqlgen", "generate")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go tool gqlgen generate: %v\n%s", err, out)
	}
	generated := []string{"graph/generated/generated.go", "graph/model/models_gen.go"}
	resolvers, _ := filepath.Glob(filepath.Join(root, "graph", "*.resolvers.go"))
	for _, r := range resolvers {
		generated = append(generated, filepath.Join("graph", filepath.Base(r)))
	}
	for _, rel := range generated {
		want, err := os.ReadFile(filepath.Join(tmp, rel))
		if err != nil {
			t.Errorf("gqlgen did not write %s: %v", rel, err)
			continue
		}
		got, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		if !bytes.Equal(want, got) {
			t.Errorf("%s is stale: run `make generate` (go tool gqlgen generate) and commit the result; first difference at line %d",
				rel, firstDiffLine(want, got))
		}
	}
}

func firstDiffLine(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}
