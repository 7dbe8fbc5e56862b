package keys

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
)

func TestRoles(t *testing.T) {
	assert.Equal(t, []Role{"ingest", "router", "viewer", "manager", "compliance", "operator", "admin"}, Roles)
	for _, r := range Roles {
		got, err := ParseRole(string(r))
		require.NoError(t, err)
		assert.Equal(t, r, got)
		assert.True(t, r.Valid())
	}
	for _, bad := range []string{"", "Admin", " admin", "admin ", "root", "viewer,admin", "*"} {
		_, err := ParseRole(bad)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "ingest, router, viewer, manager, compliance, operator, admin", bad)
		assert.False(t, Role(bad).Valid(), bad)
	}
}

func TestKeyPredicates(t *testing.T) {
	org := Key{ID: "k1", Org: "acme", Role: RoleViewer}
	platform := Key{ID: "k2", Org: PlatformOrg, Role: RoleRouter}

	assert.False(t, org.Platform())
	assert.True(t, platform.Platform())

	assert.True(t, org.MayActOn("acme"))
	assert.False(t, org.MayActOn("globex"))
	assert.False(t, org.MayActOn(""))
	assert.False(t, org.MayActOn("*"), "an org key names no platform")
	assert.False(t, org.MayActOn("ACME"))
	assert.True(t, platform.MayActOn("acme"))
	assert.True(t, platform.MayActOn("globex"))

	assert.True(t, org.Has(RoleViewer))
	assert.True(t, org.Has(RoleAdmin, RoleViewer))
	assert.False(t, org.Has())
	assert.False(t, org.Has(RoleManager, RoleCompliance))
	admin := Key{Role: RoleAdmin}
	assert.False(t, admin.Has(RoleViewer), "admin is not implied")
	assert.True(t, admin.Has(RoleViewer, RoleAdmin))

	assert.True(t, org.Active())
	org.RevokedAt = time.Now()
	assert.False(t, org.Active())
}

func TestKeyJSON(t *testing.T) {
	k := Key{ID: "k1", Org: "acme", Role: RoleViewer, Name: "grafana", CreatedAt: time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC), CreatedBy: "ops@host"}
	b, err := json.Marshal(k)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"k1","org":"acme","role":"viewer","name":"grafana","created_at":"2026-03-01T10:00:00Z","created_by":"ops@host"}`, string(b))
	k.RevokedAt, k.RevokedBy = k.CreatedAt.Add(time.Hour), "sec@host"
	b, err = json.Marshal(k)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"revoked_at":"2026-03-01T11:00:00Z","revoked_by":"sec@host"`)
}

func TestValidateOrg(t *testing.T) {
	for _, ok := range []string{"*", "acme", "org-1", "Ünïcode Org", strings.Repeat("a", schema.MaxIDBytes)} {
		assert.NoError(t, ValidateOrg(ok), ok)
	}
	for bad, want := range map[string]string{
		"":                                       "empty",
		strings.Repeat("a", schema.MaxIDBytes+1): "257 bytes",
		"**":                                     "'*'",
		"acme*":                                  "'*'",
		"* ":                                     "'*'",
		"ac\nme":                                 "control character",
		"acme\x00":                               "control character",
		"ac\u0085me":                             "control character",
		"acme\xff":                               "UTF-8",
	} {
		err := ValidateOrg(bad)
		require.Error(t, err, "%q", bad)
		assert.Contains(t, err.Error(), want, "%q", bad)
	}
}

func TestValidateNameAndBy(t *testing.T) {
	assert.NoError(t, validateName(""))
	assert.NoError(t, validateName("routing core, prod"))
	assert.ErrorContains(t, validateName(strings.Repeat("n", MaxNameBytes+1)), "more than 256")
	assert.ErrorContains(t, validateName("a\tb"), "control character")

	assert.NoError(t, validateBy("ops@host"))
	assert.ErrorContains(t, validateBy(""), "empty")
	assert.ErrorContains(t, validateBy(strings.Repeat("b", schema.MaxIDBytes+1)), "more than 256")
	assert.ErrorContains(t, validateBy("ops\r@host"), "control character")
}

func TestToken(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		tok := newToken()
		require.True(t, strings.HasPrefix(tok, TokenPrefix), tok)
		require.Len(t, tok, 47)
		require.True(t, wellFormed(tok), tok)
		raw, err := base64.RawURLEncoding.DecodeString(tok[len(TokenPrefix):])
		require.NoError(t, err)
		require.Len(t, raw, 32) // 256 bits
		require.False(t, seen[tok], "duplicate token")
		seen[tok] = true
	}
	// The bits are not constant: across 1000 tokens every bit position takes both
	// values (a stuck bit would have probability 2^-999 of passing).
	var ones, zeros [32]byte
	for tok := range seen {
		raw, _ := base64.RawURLEncoding.DecodeString(tok[len(TokenPrefix):])
		for i, b := range raw {
			ones[i] |= b
			zeros[i] |= ^b
		}
	}
	for i := range ones {
		assert.Equal(t, byte(0xff), ones[i], "byte %d", i)
		assert.Equal(t, byte(0xff), zeros[i], "byte %d", i)
	}

	tok := newToken()
	sum := sha256.Sum256([]byte(tok))
	assert.Equal(t, hex.EncodeToString(sum[:]), digestHex(tok))
	assert.Len(t, digestHex(tok), 64)
	d, ok := digestBytes(digestHex(tok))
	require.True(t, ok)
	assert.Equal(t, sum, d)
	assert.Equal(t, digest(tok), d)
}

func TestWellFormed(t *testing.T) {
	good := newToken()
	for _, bad := range []string{
		"", "bpk_", "dev-token", good[:46], good + "A", "BPK_" + good[4:], "xpk_" + good[4:],
		good[:20] + "+" + good[21:], good[:20] + "=" + good[21:], good[:20] + "/" + good[21:],
		good[:20] + " " + good[21:], good[:46] + "\x00",
	} {
		assert.False(t, wellFormed(bad), "%q", bad)
	}
	assert.True(t, wellFormed(good))
}

func TestDigestBytesRefusesMalformed(t *testing.T) {
	for _, bad := range []string{"", "abc", strings.Repeat("g", 64), strings.Repeat("a", 63), strings.Repeat("a", 65)} {
		_, ok := digestBytes(bad)
		assert.False(t, ok, "%q", bad)
	}
}

func TestEventHasNoSecret(t *testing.T) {
	k := Key{ID: schema.NewID(), Org: "acme", Role: RoleIngest, Name: "collector"}
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	ev := event(schema.TypeKeyCreated, k, at, "ops@host")
	require.NoError(t, ev.Validate())
	assert.Equal(t, schema.TypeKeyCreated, ev.Type)
	assert.Equal(t, "bandplane-keys", ev.Source)
	assert.True(t, schema.OwnSource(ev.Source))
	assert.True(t, schema.OwnType(ev.Type))
	assert.Equal(t, "acme", ev.OrgID)
	assert.Equal(t, schema.Party{ID: "ops@host", Type: schema.ActorSystem}, ev.Actor)
	assert.Equal(t, &schema.Party{ID: k.ID, Type: schema.ActorSystem}, ev.Subject)
	assert.Equal(t, at, ev.Time)
	assert.JSONEq(t, `{"key_id":"`+k.ID+`","org":"acme","role":"ingest","name":"collector"}`, string(ev.Data))

	p := event(schema.TypeKeyRevoked, Key{ID: "k2", Org: PlatformOrg, Role: RoleRouter}, at, "sec@host")
	require.NoError(t, p.Validate())
	assert.Empty(t, p.OrgID, "a platform key's event belongs to no organization")
	assert.JSONEq(t, `{"key_id":"k2","org":"*","role":"router","name":""}`, string(p.Data))
}
