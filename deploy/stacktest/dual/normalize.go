package dual

import (
	"regexp"
	"strings"
)

// The documented differences between ClickHouse 18.16 and 26.9 in the text of the same
// result (tested in dual_test.go):
//
//   - Decimal text: 18.16 writes every digit of the scale (1.500000), 26.9 drops
//     trailing zeros (1.5, and 2 for 2.000000) unless output_format_decimal_trailing_zeros
//     is on. The 26.9 engine runs with it on (deploy/local/chdb/engine.py), so Decimal
//     text is compared as it is.
//   - The zero DateTime and Date: 18.16 writes 0000-00-00 00:00:00 and 0000-00-00, 26.9
//     the epoch (1970-01-01 00:00:00, 1970-01-01). Normalize writes both as the epoch, in
//     Date and DateTime columns only (also inside Nullable, Array and Tuple): a String
//     column holding that text is data and compared as it is.
var dateType = regexp.MustCompile(`\bDate(Time)?\b`)

var zeroTime = strings.NewReplacer("0000-00-00 00:00:00", "1970-01-01 00:00:00", "0000-00-00", "1970-01-01")

// Normalize returns r with the documented differences between the two ClickHouse
// generations removed (r itself is left alone).
func Normalize(r *Result) *Result {
	out := &Result{Columns: append([]Column(nil), r.Columns...), Rows: make([][]string, len(r.Rows))}
	dates := make([]bool, len(r.Columns))
	for i, c := range r.Columns {
		dates[i] = dateType.MatchString(c.Type) && !strings.Contains(c.Type, "String")
	}
	for i, row := range r.Rows {
		nr := append([]string(nil), row...)
		for j := range nr {
			if dates[j] {
				nr[j] = zeroTime.Replace(nr[j])
			}
		}
		out.Rows[i] = nr
	}
	return out
}
