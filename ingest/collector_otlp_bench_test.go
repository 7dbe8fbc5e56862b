package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/ingest"
)

type discardProducer struct{}

func (discardProducer) ProduceMessages(context.Context, []kafkago.Message) error { return nil }

// BenchmarkCollectorUsage compares what one request of 1,000 usage reports costs the
// collector as canonical NDJSON on /v1/events and as GenAI spans on /v1/traces, Kafka
// left out.
func BenchmarkCollectorUsage(b *testing.B) {
	const n = 1000
	at := now.Add(-time.Minute)
	var nd bytes.Buffer
	tokens := make([][3]int64, n)
	for j := range n {
		tokens[j] = [3]int64{int64(1000 + j), 100, int64(j % 400)}
		fmt.Fprintf(&nd, `{"id":"native-%d","type":"usage.reported","time":%q,"org_id":"org-acme","room_id":"conv-%d","actor":{"id":"agent-acme","type":"agent"},"execution_id":"exec-%d","source":"bench","data":{"model":"gpt-5","input_tokens":%d,"output_tokens":100,"cache_read_tokens":%d,"cache_write_tokens":0}}`+"\n",
			j, at.Format(time.RFC3339Nano), j%200, j/8, 1000+j-j%400, j%400)
	}
	spans := protoBody(b, genAITraces("checkout", at, tokens...))
	c, err := ingest.NewCollector(ingest.CollectorConfig{Producer: discardProducer{}, Auth: collectorKeys, Now: func() time.Time { return now },
		Registrations: registrations{"agent-acme": "org-acme"}, Bindings: otlpBindings{}, MaxLines: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, ctype string
		h                 http.Handler
		body              []byte
	}{
		{"native", "/v1/events", "application/x-ndjson", c, nd.Bytes()},
		{"otlp", "/v1/traces", "application/x-protobuf", c.TracesHandler(), spans},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.body)))
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, tc.path, bytes.NewReader(tc.body))
				req.Header.Set("Content-Type", tc.ctype)
				req.Header.Set("Authorization", "Bearer acme")
				rec := httptest.NewRecorder()
				tc.h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "reports/s")
		})
	}
}
