package schema

import (
	"os"
	"testing"
)

func BenchmarkDecodeCanonical(b *testing.B) {
	line := []byte(canonicalMessage)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(line); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeCanonicalUsage is the canonical path with the data check that parses data.
func BenchmarkDecodeCanonicalUsage(b *testing.B) {
	line := []byte(`{"id":"0b7c6a2e-4f5d-8a9b-9c1d-2e3f4a5b6c7d","type":"usage.reported","time":"2026-02-09T10:31:05Z","room_id":"room-123","actor":{"id":"agent-123","type":"agent"},"source":"band","schema_version":1,"data":{"input_tokens":1200,"output_tokens":340,"cache_read_tokens":0,"cache_write_tokens":0,"message_id":"evt-201"}}`)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(line); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeFrame(b *testing.B) {
	all, err := os.ReadFile("testdata/band/frames.ndjson")
	if err != nil {
		b.Fatal(err)
	}
	line := splitLines(all)[0] // message_created
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeAt(line, received); err != nil {
			b.Fatal(err)
		}
	}
}
