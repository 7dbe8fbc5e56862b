package main

import (
	"context"
	"crypto/ed25519"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/query/trail"
)

// sealFlags configure serve's sealing of the audit trail.
type sealFlags struct {
	keyFile string
	every   time.Duration
}

func (s *sealFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.keyFile, "audit-key", envOr("BANDPLANE_AUDIT_KEY", ""), "Ed25519 private key file (bandplane audit keygen) to seal the audit trail with (env BANDPLANE_AUDIT_KEY); without it nothing is sealed")
	fs.DurationVar(&s.every, "seal-every", time.Minute, "how often what was ingested is sealed (with --audit-key)")
}

// sealer returns the sealer of the trail, or nil without --audit-key; close releases
// its Kafka clients.
func (s *sealFlags) sealer(ctx context.Context, st *stackFlags, conn driver.Conn, ingestGroup string, log *slog.Logger, reg prometheus.Registerer) (*trail.Sealer, func() error, error) {
	if s.keyFile == "" {
		return nil, func() error { return nil }, nil
	}
	key, err := trail.LoadPrivateKey(s.keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot use --audit-key: %w", err)
	}
	return newSealer(ctx, st, conn, key, s.every, sealerPriorityServe, ingestGroup, log, reg)
}

// log returns the reader of the audit log, checked against --audit-key's public half,
// or nil without --audit-key.
func (s *sealFlags) log(conn driver.Conn, st *stackFlags) (*trail.Log, error) {
	if s.keyFile == "" {
		return nil, nil
	}
	pub, err := trail.LoadPublicKey(s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("cannot use --audit-key: %w", err)
	}
	prefix, err := st.prefix()
	if err != nil {
		return nil, err
	}
	return trail.NewLog(conn, st.ch.Database, prefix, []ed25519.PublicKey{pub})
}

// sealingPart is serve's sealer of the audit trail.
type sealingPart struct {
	sealer *trail.Sealer
}

// newSealingPart builds the sealer, nil without --audit-key.
func newSealingPart(ctx context.Context, d *serveDeps) (*sealingPart, error) {
	sealer, closeSealer, err := d.c.seal.sealer(ctx, &d.c.stack, d.conn, d.c.group, d.log, d.reg)
	if err != nil {
		return nil, err
	}
	d.closers = append(d.closers, closeSealer)
	if sealer == nil {
		return nil, nil
	}
	return &sealingPart{sealer: sealer}, nil
}

// component runs the sealer (nil without --audit-key). It stops last, after ingest's
// last flush, so that its last seal covers that flush.
func (s *sealingPart) component() *component {
	if s == nil {
		return nil
	}
	return &component{name: "sealing", stage: stageSeal,
		run: func(ctx context.Context) error { _ = s.sealer.Run(ctx); return nil }}
}
