package trail

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema/tlog"
)

func TestGenerateAndLoadKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.key")
	require.NoError(t, GenerateKey(path))

	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	block, _ := pem.Decode(data)
	require.NotNil(t, block)
	assert.Equal(t, "PRIVATE KEY", block.Type)
	pubData, err := os.ReadFile(path + ".pub")
	require.NoError(t, err)
	block, _ = pem.Decode(pubData)
	require.NotNil(t, block)
	assert.Equal(t, "PUBLIC KEY", block.Type)

	priv, err := LoadPrivateKey(path)
	require.NoError(t, err)
	pub, err := LoadPublicKey(path + ".pub")
	require.NoError(t, err)
	assert.Equal(t, pubOf(priv), pub)
	fromPriv, err := LoadPublicKey(path) // the private file works for verify too
	require.NoError(t, err)
	assert.Equal(t, pub, fromPriv)
	assert.Len(t, tlog.KeyID(pub), 32)

	// Never overwritten.
	err = GenerateKey(path)
	assert.ErrorContains(t, err, path+" already exists")
	again, err := LoadPrivateKey(path)
	require.NoError(t, err)
	assert.Equal(t, priv, again)
	require.NoError(t, os.Remove(path))
	assert.ErrorContains(t, GenerateKey(path), path+".pub already exists")
	assert.ErrorContains(t, GenerateKey(""), "no key file given (--out)")
	assert.ErrorContains(t, GenerateKey(filepath.Join(t.TempDir(), "no", "such", "dir", "k")), "cannot create audit key file")
}

func TestLoadKeyHostile(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	good := filepath.Join(dir, "good.key")
	require.NoError(t, GenerateKey(good))

	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	rsaDER, err := x509.MarshalPKCS8PrivateKey(rsaKey)
	require.NoError(t, err)
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ecPubDER, err := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	require.NoError(t, err)

	missing := filepath.Join(dir, "missing.key")
	empty := write("empty.key", []byte("\n \n"))
	garbage := write("garbage.key", []byte("not a key at all\x00\xff"))
	badDER := write("bad-der.key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("garbage")}))
	badPubDER := write("bad-der.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("garbage")}))
	rsaFile := write("rsa.key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: rsaDER}))
	ecPub := write("ec.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecPubDER}))
	cert := write("cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("x")}))

	for _, tc := range []struct {
		name, path, want string
		public           bool
	}{
		{"no path", "", "no audit key file given (--audit-key or BANDPLANE_AUDIT_KEY)", false},
		{"missing", missing, "audit key " + missing + " does not exist (`bandplane audit keygen --out " + missing + "` makes one)", false},
		{"missing public", missing, "does not exist", true},
		{"empty", empty, "audit key " + empty + " is empty", false},
		{"empty public", empty, "is empty", true},
		{"garbage", garbage, "audit key " + garbage + " is not PEM", false},
		{"public where private is needed", good + ".pub", "audit key " + good + ".pub is a public key: sealing needs the private key", false},
		{"bad PKCS#8", badDER, "audit key " + badDER + " is not a PKCS#8 private key", false},
		{"bad PKIX", badPubDER, "audit key " + badPubDER + " is not a PKIX public key", true},
		{"RSA", rsaFile, "audit key " + rsaFile + " is an RSA key, want an Ed25519 key", false},
		{"RSA for verify", rsaFile, "is an RSA key, want an Ed25519 key", true},
		{"ECDSA public", ecPub, "audit key " + ecPub + " is an ECDSA key, want an Ed25519 key", true},
		{"other PEM", cert, `holds a PEM "CERTIFICATE" block`, false},
		{"other PEM public", cert, `holds a PEM "CERTIFICATE" block`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.public {
				_, err = LoadPublicKey(tc.path)
			} else {
				_, err = LoadPrivateKey(tc.path)
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
