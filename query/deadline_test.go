package query

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
)

// TestIntegrationDeadlineStopsTheQuery: a query over its context's deadline stops there
// (clickhouse-go cancels it on the server) and is reported as ErrTimeout.
func TestIntegrationDeadlineStopsTheQuery(t *testing.T) {
	conn, _ := stacktest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	var n uint64
	err := conn.QueryRow(ctx, "SELECT count() FROM numbers(1000000000000)").Scan(&n)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 10*time.Second, "stopped at the deadline, not run to the end")
	err = queryErr(ctx, err, "cannot count")
	assert.True(t, errors.Is(err, ErrTimeout), "%v", err)
	assert.Contains(t, err.Error(), "cannot count: query took longer than its deadline")

	// The connection pool is usable afterwards.
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT 1").Scan(new(uint8)))
}

func TestQueryErrWithoutDeadline(t *testing.T) {
	assert.False(t, errors.Is(queryErr(context.Background(), errors.New("boom"), "what"), ErrTimeout))
	assert.EqualError(t, queryErr(context.Background(), errors.New("boom"), "what"), "what: boom")
}
