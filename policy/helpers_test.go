package policy

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// exampleEngine is an Engine over testdata/directory.json.
func exampleEngine(t testing.TB) *Engine {
	t.Helper()
	ctx := context.Background()
	snap, err := LoadDirectoryFile("testdata/directory.json")
	require.NoError(t, err)
	dir := NewDirectory()
	require.NoError(t, dir.Load(ctx, snap))
	e, err := New(ctx, Config{Directory: dir})
	require.NoError(t, err)
	return e
}
