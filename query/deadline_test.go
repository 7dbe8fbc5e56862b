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

// TestIntegrationDeadlineReachesClickHouse: a request's deadline travels to ClickHouse
// as max_execution_time, so the server stops a query the client would give up on, even
// when the client does not cancel it.
func TestIntegrationDeadlineReachesClickHouse(t *testing.T) {
	conn, _ := stacktest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// The settings without the client's own deadline: only the server can stop it.
	serverOnly := context.WithoutCancel(withDeadline(ctx))
	start := time.Now()
	var n uint64
	err := conn.QueryRow(serverOnly, "SELECT count() FROM numbers(1000000000000)").Scan(&n)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 20*time.Second, "stopped by max_execution_time, not run to the end")
	err = queryErr(serverOnly, err, "cannot count")
	assert.True(t, errors.Is(err, ErrTimeout), "%v", err)
	assert.Contains(t, err.Error(), "cannot count: query took longer than its deadline")
}

func TestWithDeadlineLeavesAContextWithoutDeadlineAlone(t *testing.T) {
	ctx := context.Background()
	assert.Equal(t, ctx, withDeadline(ctx))
	assert.False(t, errors.Is(queryErr(ctx, errors.New("boom"), "what"), ErrTimeout))
}
