package dual

import (
	"regexp"
	"strings"
)

// The documented differences between ClickHouse 18.16 and 26.9 in the text of the same
// result, which Normalize removes (each is tested in normalize_test.go):
//
//   - Decimal text: 18.16 writes every digit of the scale (1.500000), 26.9 drops
//     trailing zeros (1.5, and 2 for 2.000000). Decimal values, also inside arrays and
//     tuples, are written without trailing zeros.
//   - The zero DateTime and Date: 18.16 writes 0000-00-00 00:00:00 and 0000-00-00, 26.9
//     the epoch (1970-01-01 00:00:00, 1970-01-01). Both are written as the epoch.
var decimalType = regexp.MustCompile(`Decimal(32|64|128)?\(`)

// decimalText is a decimal number with a fraction inside a value.
var decimalText = regexp.MustCompile(`-?\d+\.\d+`)

// Normalize returns r with the documented differences between the two ClickHouse
// generations removed (r itself is left alone).
func Normalize(r *Result) *Result {
	out := &Result{Columns: append([]Column(nil), r.Columns...), Rows: make([][]string, len(r.Rows))}
	dec := make([]bool, len(r.Columns))
	for i, c := range r.Columns {
		dec[i] = decimalType.MatchString(c.Type)
	}
	for i, row := range r.Rows {
		nr := append([]string(nil), row...)
		for j := range nr {
			nr[j] = zeroTime.Replace(nr[j])
			if dec[j] {
				nr[j] = decimalText.ReplaceAllStringFunc(nr[j], trimDecimal)
			}
		}
		out.Rows[i] = nr
	}
	return out
}

var zeroTime = strings.NewReplacer("0000-00-00 00:00:00", "1970-01-01 00:00:00", "0000-00-00", "1970-01-01")

func trimDecimal(s string) string {
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
