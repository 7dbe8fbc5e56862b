package query

import "time"

// SetClock makes qr read the time from now, for the tests of package query_test: what
// a test expects of a default range or a watermark is then computed from the instant
// the query reads, not from a second reading of the wall clock.
func SetClock(qr *Querier, now func() time.Time) { qr.now = now }
