package schema

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func BenchmarkCheckJSONCanonical(b *testing.B) {
	line := []byte(canonicalMessage)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if err := checkJSON(line, 0, ""); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkJSONValidCanonical(b *testing.B) {
	line := []byte(canonicalMessage)
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if !json.Valid(line) {
			b.Fatal("invalid")
		}
	}
}

// BenchmarkValidateCanonical is the validation part of BenchmarkDecodeCanonical.
func BenchmarkValidateCanonical(b *testing.B) {
	e, err := Decode([]byte(canonicalMessage))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := e.validate(true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckJSONKeys measures the duplicate check on objects of n keys (the set
// takes over past linearKeys).
func BenchmarkCheckJSONKeys(b *testing.B) {
	for _, n := range []int{8, 16, 17, 32, 64, 256} {
		var sb strings.Builder
		sb.WriteString("{")
		for i := 0; i < n; i++ {
			if i > 0 {
				sb.WriteString(",")
			}
			fmt.Fprintf(&sb, `"field_%03d":%d`, i, i)
		}
		sb.WriteString("}")
		line := []byte(sb.String())
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			b.ReportAllocs()
			for b.Loop() {
				if err := checkJSON(line, 0, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeTooDeep is the refusal of a line nested past 64 levels: the scan stops
// at level 65, so 3,000,000 levels (a 6 MB line) cost what 65 do.
func BenchmarkDecodeTooDeep(b *testing.B) {
	for _, depth := range []int{65, 3_000_000} {
		line := deepLine(depth)
		b.Run(fmt.Sprint(depth), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(line); err == nil {
					b.Fatal("accepted")
				}
			}
		})
	}
}
