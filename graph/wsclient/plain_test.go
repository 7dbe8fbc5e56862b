package wsclient

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

// plainNext takes exactly the frames whose full decoding gives the same id and data,
// and leaves every other frame to it.
func TestPlainNextAgreesWithTheFullDecoding(t *testing.T) {
	for _, tc := range []struct {
		frame string
		plain bool
	}{
		{`{"id":"1","type":"next","payload":{"data":{"workStatusChanged":{"title":"x"}}}}`, true},
		{`{"id":"7","type":"next","payload":{"data":null}}`, true},
		{`{"id":"a\"b","type":"next","payload":{"data":{}}}`, false},     // an escaped id
		{`{"id":"1","type":"next","payload":{"data":{}},"x":{}}`, false}, // a key after the payload
		{`{"id":"1","type":"next","payload":{"data":{"a":1},"errors":[]}}`, false},
		{`{"id":"1","type":"next","payload":{"data":{"a":}}}`, false}, // not JSON
		{`{"id":"1","type":"next","payload":{"errors":[{"message":"m"}],"data":null}}`, false},
		{`{"type":"next","id":"1","payload":{"data":{}}}`, false}, // another key order
		{`{"id":"1","type":"next","payload":{"data":`, false},     // truncated
	} {
		id, data, ok := plainNext([]byte(tc.frame))
		assert.Equal(t, tc.plain, ok, tc.frame)
		if !ok {
			continue
		}
		var f struct {
			ID      string `json:"id"`
			Payload struct {
				Data json.RawMessage `json:"data"`
			} `json:"payload"`
		}
		if assert.NoError(t, json.Unmarshal([]byte(tc.frame), &f), tc.frame) {
			assert.Equal(t, f.ID, id, tc.frame)
			assert.JSONEq(t, string(f.Payload.Data), string(data), tc.frame)
		}
	}
}
