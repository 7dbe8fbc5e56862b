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
	tag := stacktest.Name(t) // names the query's column: system.processes shows it
	var n uint64
	// Run to its end, the count would succeed, minutes later: the error is the deadline's.
	err := conn.QueryRow(ctx, "SELECT count() AS "+tag+" FROM numbers(1000000000000)").Scan(&n)
	require.Error(t, err)
	err = queryErr(ctx, err, "cannot count")
	assert.True(t, errors.Is(err, ErrTimeout), "%v", err)
	assert.Contains(t, err.Error(), "cannot count: query took longer than its deadline")
	// Stopped on the server, not only given up by the client.
	var running uint64
	require.True(t, stacktest.Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool {
		err := conn.QueryRow(context.Background(), "SELECT count() FROM system.processes WHERE position(query, ?) > 0 AND position(query, 'system.processes') = 0", tag).Scan(&running)
		return err == nil && running == 0
	}), "the query still runs on the server")

	// The connection pool is usable afterwards.
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT 1").Scan(new(uint8)))
}

func TestQueryErrWithoutDeadline(t *testing.T) {
	assert.False(t, errors.Is(queryErr(context.Background(), errors.New("boom"), "what"), ErrTimeout))
	assert.EqualError(t, queryErr(context.Background(), errors.New("boom"), "what"), "what: boom")
}
