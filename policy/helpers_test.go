package policy

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// exampleDirectory is a Directory of testdata/directory.json.
func exampleDirectory(t testing.TB) *Directory {
	t.Helper()
	snap, err := LoadDirectoryFile("testdata/directory.json")
	require.NoError(t, err)
	dir := NewDirectory()
	require.NoError(t, dir.Load(context.Background(), snap))
	return dir
}

// exampleEngine is an Engine over testdata/directory.json.
func exampleEngine(t testing.TB) *Engine {
	t.Helper()
	e, err := New(context.Background(), Config{Directory: exampleDirectory(t)})
	require.NoError(t, err)
	return e
}
