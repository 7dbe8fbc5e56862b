package trail

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// The audit key: an Ed25519 private key as PEM "PRIVATE KEY" (PKCS#8, file mode 0600),
// and its public half as PEM "PUBLIC KEY" (PKIX) in FILE.pub. Sealing needs the private
// key; verifying needs only the public one (the private file works too).

const (
	pemPrivate = "PRIVATE KEY"
	pemPublic  = "PUBLIC KEY"
)

// GenerateKey writes a new key to path (0600) and its public half to path+".pub"
// (0644). It refuses to overwrite either file: a lost audit key cannot be made again,
// and replacing it by accident would leave the seals made with it unverifiable.
func GenerateKey(path string) error {
	if path == "" {
		return errors.New("no key file given (--out)")
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("cannot generate an Ed25519 key: %w", err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("cannot encode the private key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return fmt.Errorf("cannot encode the public key: %w", err)
	}
	for _, p := range []string{path, path + ".pub"} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("cannot write audit key: %s already exists (choose another --out, or remove it if it is really unused)", p)
		}
	}
	if err := writeNew(path, 0o600, pem.EncodeToMemory(&pem.Block{Type: pemPrivate, Bytes: privDER})); err != nil {
		return err
	}
	if err := writeNew(path+".pub", 0o644, pem.EncodeToMemory(&pem.Block{Type: pemPublic, Bytes: pubDER})); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

func writeNew(path string, mode os.FileMode, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("cannot create audit key file %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close() // the write error is the one reported
		_ = os.Remove(path)
		return fmt.Errorf("cannot write audit key file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("cannot write audit key file %s: %w", path, err)
	}
	return nil
}

// LoadPrivateKey reads the private key that GenerateKey wrote.
func LoadPrivateKey(path string) (ed25519.PrivateKey, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	switch block.Type {
	case pemPrivate:
	case pemPublic:
		return nil, fmt.Errorf("audit key %s is a public key: sealing needs the private key (the file without .pub that `bandplane audit keygen` wrote)", path)
	default:
		return nil, fmt.Errorf("audit key %s holds a PEM %q block, want %q (PKCS#8 Ed25519, as `bandplane audit keygen` writes)", path, block.Type, pemPrivate)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("audit key %s is not a PKCS#8 private key: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("audit key %s is %s, want an Ed25519 key (`bandplane audit keygen` makes one)", path, keyKind(k))
	}
	return priv, nil
}

// LoadPublicKey reads the public key from a public key file (FILE.pub) or from the
// private key file itself.
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	switch block.Type {
	case pemPrivate:
		priv, err := LoadPrivateKey(path)
		if err != nil {
			return nil, err
		}
		return priv.Public().(ed25519.PublicKey), nil
	case pemPublic:
	default:
		return nil, fmt.Errorf("audit key %s holds a PEM %q block, want %q or %q", path, block.Type, pemPublic, pemPrivate)
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("audit key %s is not a PKIX public key: %w", path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("audit key %s is %s, want an Ed25519 key", path, keyKind(k))
	}
	return pub, nil
}

func readPEM(path string) (*pem.Block, error) {
	if path == "" {
		return nil, errors.New("no audit key file given (--audit-key or BANDPLANE_AUDIT_KEY)")
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("audit key %s does not exist (`bandplane audit keygen --out %s` makes one)", path, path)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read audit key %s: %w", path, err)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, fmt.Errorf("audit key %s is empty", path)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("audit key %s is not PEM (want the file `bandplane audit keygen` wrote)", path)
	}
	return block, nil
}

func keyKind(k any) string {
	switch k.(type) {
	case *rsa.PrivateKey, *rsa.PublicKey:
		return "an RSA key"
	case *ecdsa.PrivateKey, *ecdsa.PublicKey:
		return "an ECDSA key"
	}
	return fmt.Sprintf("a %T", k)
}
