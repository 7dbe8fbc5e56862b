package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/stretchr/testify/assert"
)

func TestPermanent(t *testing.T) {
	ex := func(code int32, msg string) error {
		return fmt.Errorf("cannot insert 3 rows into db.events: %w", &clickhouse.Exception{Code: code, Message: msg})
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"throwIf", ex(395, "Value passed to 'throwIf' function is non zero"), true},
		{"decimal overflow", ex(407, "Decimal math overflow"), true},
		{"cannot parse", ex(6, "Cannot parse input"), true},
		{"type mismatch", ex(53, "Type mismatch"), true},
		{"too many partitions", ex(252, "Too many partitions for single INSERT block (more than 100)."), true},
		{"value the client cannot encode", fmt.Errorf("cannot append row 3 to db.events: %w",
			&ValueError{Table: "db.events", Err: &column.Error{ColumnType: "Enum8", Err: errors.New(`unknown element "robot"`)}}), true},

		{"too many parts", ex(252, "Too many parts (300). Merges are processing significantly slower than inserts"), false},
		{"unknown table", ex(60, "Table db.events doesn't exist"), false},
		{"unknown database", ex(81, "Database db doesn't exist"), false},
		{"unknown column", ex(16, "There is no column poison in table"), false},
		{"unknown identifier", ex(47, "Unknown identifier: poison"), false},
		{"timeout", ex(159, "Timeout exceeded"), false},
		{"read only", ex(164, "Cannot execute query in readonly mode"), false},
		{"memory", ex(241, "Memory limit (total) exceeded"), false},
		{"keeper", ex(999, "Coordination::Exception"), false},
		{"unknown status of insert", ex(319, "Unknown status"), false},
		{"a code not listed", ex(1002, "something new"), false},
		{"network", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, false},
		{"eof", fmt.Errorf("cannot insert: %w", io.EOF), false},
		{"canceled", fmt.Errorf("cannot insert: %w", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, false},
		{"nil", nil, false},
	} {
		assert.Equal(t, tc.want, Permanent(tc.err), tc.name)
	}
}

func TestMemoryLimit(t *testing.T) {
	wrapped := fmt.Errorf("cannot insert 3 rows into db.events: %w", &clickhouse.Exception{Code: 241, Message: "Memory limit (for query) exceeded"})
	assert.True(t, MemoryLimit(wrapped))
	assert.False(t, Permanent(wrapped), "not refused data: a smaller insert may pass")
	assert.False(t, MemoryLimit(&clickhouse.Exception{Code: 159, Message: "Timeout exceeded"}))
	assert.False(t, MemoryLimit(&clickhouse.Exception{Code: 395, Message: "Memory limit in the value"}), "by code, not by message")
	assert.False(t, MemoryLimit(errors.New("code: 241, Memory limit exceeded")), "only a ClickHouse exception")
	assert.False(t, MemoryLimit(context.Canceled))
	assert.False(t, MemoryLimit(nil))
}
