package query

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// A response budget bounds the bytes the reads of one API response may bring into the
// process: each read runs with ClickHouse's max_result_bytes set to what is left
// (result_overflow_mode is 'throw', its default), so ClickHouse refuses a result over it before it is
// sent, and what each read returned (its profile's result bytes) is taken off for the
// next. Row limits alone do not bound bytes: a page of 10,000 events of 1 MiB each is
// within every row limit.

// ErrResponseTooLarge matches (errors.Is) a read refused because its result would pass
// the response's byte budget.
var ErrResponseTooLarge = errors.New("the answer is larger than the response's byte budget")

// IsResponseTooLarge says whether err is a read refused for the response's byte budget,
// whether it was refused before it ran or by ClickHouse as its result grew.
func IsResponseTooLarge(err error) bool {
	var ex *clickhouse.Exception
	return errors.Is(err, ErrResponseTooLarge) || errors.As(err, &ex) && ex.Code == tooManyRowsOrBytes
}

// tooManyRowsOrBytes is ClickHouse's code for a result over max_result_bytes.
const tooManyRowsOrBytes = 396

type budgetKey struct{}

// ResponseBudget is what the reads of one response may still return, in bytes.
type ResponseBudget struct {
	limit int64
	left  atomic.Int64
}

// WithResponseBudget gives the reads made with ctx a budget of bytes in all.
func WithResponseBudget(ctx context.Context, bytes int64) context.Context {
	b := &ResponseBudget{limit: bytes}
	b.left.Store(bytes)
	return context.WithValue(ctx, budgetKey{}, b)
}

// Limit is the budget's size in bytes.
func (b *ResponseBudget) Limit() int64 { return b.limit }

// Used is what the reads made with the budget returned so far, in bytes.
func (b *ResponseBudget) Used() int64 { return b.limit - b.left.Load() }

// BudgetOf returns the response budget of ctx, nil without one.
func BudgetOf(ctx context.Context) *ResponseBudget { return budgetOf(ctx) }

// budgetOf returns ctx's budget, nil without one.
func budgetOf(ctx context.Context) *ResponseBudget {
	b, _ := ctx.Value(budgetKey{}).(*ResponseBudget)
	return b
}

// budgetConn applies the response budget of a read's context, if it has one.
type budgetConn struct{ driver.Conn }

func (c budgetConn) ctx(ctx context.Context) (context.Context, error) {
	b := budgetOf(ctx)
	if b == nil {
		return ctx, nil
	}
	left := b.left.Load()
	if left <= 0 {
		return nil, fmt.Errorf("%w (%d bytes) before this read", ErrResponseTooLarge, b.limit)
	}
	return clickhouse.Context(ctx,
		// An int: 18.16's protocol carries settings as numbers. result_overflow_mode
		// is 'throw' by default, and a string setting cannot be sent to it.
		clickhouse.WithSettings(clickhouse.Settings{"max_result_bytes": int(left)}),
		clickhouse.WithProfileInfo(func(p *clickhouse.ProfileInfo) { b.left.Add(-int64(min(p.Bytes, 1<<62))) }),
	), nil
}

func (c budgetConn) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	ctx, err := c.ctx(ctx)
	if err != nil {
		return nil, err
	}
	return c.Conn.Query(ctx, query, args...)
}

func (c budgetConn) Select(ctx context.Context, dest any, query string, args ...any) error {
	ctx, err := c.ctx(ctx)
	if err != nil {
		return err
	}
	return c.Conn.Select(ctx, dest, query, args...)
}

func (c budgetConn) QueryRow(ctx context.Context, query string, args ...any) driver.Row {
	bctx, err := c.ctx(ctx)
	if err != nil {
		return errRow{err}
	}
	return c.Conn.QueryRow(bctx, query, args...)
}

// errRow is a row whose read failed before it was sent.
type errRow struct{ err error }

func (r errRow) Err() error           { return r.err }
func (r errRow) Scan(...any) error    { return r.err }
func (r errRow) ScanStruct(any) error { return r.err }
