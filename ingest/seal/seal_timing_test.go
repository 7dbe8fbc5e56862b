package seal

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest/store"
)

// Run with: BANDPLANE_INTEGRATION=1 go test -run '^$' -bench . -benchtime 1x ./ingest/seal/

const benchRows = 100_000

// benchTrail is a database of 100k events of three organizations over the last day,
// ~250 bytes of data each, ingested a minute ago.
func benchTrail(b *testing.B) (driver.Conn, string) {
	b.Helper()
	conn, db := testDB(b)
	now := time.Now().UTC()
	pad := strings.Repeat("x", 200)
	for off := 0; off < benchRows; off += 20_000 {
		rs := rows(fmt.Sprintf("bench%d", off), 20_000, orgs3, now.Add(-24*time.Hour).Add(time.Duration(off)*time.Second/2), now.Add(-time.Minute))
		for i := range rs {
			rs[i].Data = fmt.Sprintf(`{"content":"message %d %s"}`, i, pad)
		}
		require.NoError(b, store.New(conn, db).BatchInsert(context.Background(), &store.Batch{Events: rs}))
	}
	return conn, db
}

func BenchmarkSeal100k(b *testing.B) {
	stacktest.Require(b)
	key := testKey(b)
	for range b.N {
		b.StopTimer()
		conn, db := benchTrail(b)
		s := newSealer(b, conn, db, key, &fakeProducer{})
		b.StartTimer()
		res, err := s.SealNow(context.Background())
		require.NoError(b, err)
		require.Equal(b, benchRows, res.Events)
		b.ReportMetric(float64(res.Seals), "seals")
	}
}

// The steady state of serve: a run over a sealed 100k-row trail that finds 1,000 new rows.
func BenchmarkSealIncremental(b *testing.B) {
	stacktest.Require(b)
	key := testKey(b)
	conn, db := benchTrail(b)
	s := newSealer(b, conn, db, key, &fakeProducer{})
	_, err := s.SealNow(context.Background())
	require.NoError(b, err)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		insert(b, conn, db, rows(fmt.Sprintf("inc%d", i), 1000, orgs3, time.Now().UTC().Add(-time.Hour), time.Now().UTC().Add(-2*time.Second)))
		b.StartTimer()
		res, err := s.SealNow(context.Background())
		require.NoError(b, err)
		require.Equal(b, 1000, res.Events)
	}
}

func BenchmarkVerify100k(b *testing.B) {
	stacktest.Require(b)
	key := testKey(b)
	conn, db := benchTrail(b)
	_, err := newSealer(b, conn, db, key, &fakeProducer{}).SealNow(context.Background())
	require.NoError(b, err)
	b.ResetTimer()
	for range b.N {
		rep := verify(b, conn, db, pubOf(key), Filter{})
		require.Empty(b, rep.Problems)
		require.Equal(b, benchRows, rep.SealedEvents)
	}
}
