package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/kafka"
)

// TestBenchPolicySmall runs `bench policy` on a small directory without audit (no
// server needed) and checks the JSON line it prints.
func TestBenchPolicySmall(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"bench", "policy", "--agents", "200", "--contacts", "400", "--n", "300",
		"--http-clients", "4", "--http-warmup", "100ms", "--http-duration", "300ms"}, strings.NewReader(""), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var res benchPolicyResult
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	for name, l := range map[string]float64{"add_participant": res.AddParticipant.P99Us, "send_message": res.SendMessage.P99Us, "bare_opa": res.BareOPA.P99Us} {
		assert.Positive(t, l, name)
	}
	assert.Positive(t, res.OverheadRatio)
	assert.Positive(t, res.SendMessageReserving.P99Us)
	assert.Positive(t, res.SendMessageReserving.Ledger.P99Us)
	assert.Equal(t, 200+40+40, res.SendMessageReserving.Budgets, "a budget on every agent, owner (five agents each) and organization")
	assert.Positive(t, res.SendMessageReserving.Allowed)
	assert.Positive(t, res.HTTP.OK)
	assert.Zero(t, res.HTTP.Failed)
	assert.Positive(t, res.HTTPPerS)
	assert.Equal(t, res.HTTP.PerS, res.HTTPPerS)
	assert.Nil(t, res.HTTPAudited)
	assert.Equal(t, 4, res.HTTP.Clients)
	assert.Contains(t, errOut.String(), "bench: HTTP without audit: 4 clients")
}

func TestBenchPolicyRefusesBadFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"bench", "policy", "--http-warmup", "-1s"}, strings.NewReader(""), &out, &errOut)
	assert.NotZero(t, code)
	assert.Contains(t, errOut.String(), "--http-warmup >= 0")
}

// TestIntegrationBenchPolicyAudit runs `bench policy --audit` against the real broker:
// every answered decision was acknowledged by Kafka, and the topic holds them.
func TestIntegrationBenchPolicyAudit(t *testing.T) {
	stacktest.Require(t)
	topic := stacktest.Topic(t, 4)
	var out, errOut bytes.Buffer
	code := run([]string{"bench", "policy", "--agents", "200", "--contacts", "400", "--n", "200", "--audit",
		"--kafka", strings.Join(stacktest.Brokers(), ","), "--audit-topic", topic,
		"--http-clients", "2", "--http-audit-clients", "16", "--http-warmup", "200ms", "--http-duration", "500ms"}, strings.NewReader(""), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var res benchPolicyResult
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	require.NotNil(t, res.HTTPAudited)
	assert.Positive(t, res.HTTPAudited.OK)
	assert.Zero(t, res.HTTPAudited.Failed)
	assert.Equal(t, 16, res.HTTPAudited.Clients)

	total, _, err := kafka.Lag(context.Background(), stacktest.Brokers(), topic, "nobody-"+topic)
	require.NoError(t, err)
	// Warm-up and measured decisions were all audited (the group never committed, so
	// its lag is the topic's size).
	assert.GreaterOrEqual(t, total, res.HTTPAudited.OK)
}
