package store

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/shopspring/decimal"
)

// PriceRow is one row of prices (migration 006): one model's prices from Effective on,
// as set by catalog version CatalogVersion. Prices are in nano-units of Currency per
// million tokens (pricing.Price's unit).
type PriceRow struct {
	CatalogVersion                                  uint64
	Model                                           string
	Effective                                       time.Time
	Provider                                        string
	Aliases                                         []string
	Currency                                        string
	Input, Output, CacheRead, CacheWrite, Reasoning int64
	HasReasoning                                    bool
	SetBy                                           string
	SetAt                                           time.Time
	SetID                                           string
	Note                                            string
}

const priceCols = "catalog_version, model, effective, provider, aliases, currency, input_per_mtok, output_per_mtok," +
	" cache_read_per_mtok, cache_write_per_mtok, reasoning_per_mtok, has_reasoning, set_by, set_at, set_id, note"

func nanos(n int64) decimal.Decimal { return decimal.New(n, -9) }

// InsertPrices writes price rows in one insert (the table is not partitioned).
func (s *Store) InsertPrices(ctx context.Context, rows []PriceRow) error {
	return s.send(ctx, "prices", priceCols, len(rows), nil, func(b driver.Batch, i int) error {
		r := &rows[i]
		aliases := r.Aliases
		if aliases == nil {
			aliases = []string{}
		}
		return b.Append(r.CatalogVersion, r.Model, r.Effective.UTC(), r.Provider, aliases, r.Currency,
			nanos(r.Input), nanos(r.Output), nanos(r.CacheRead), nanos(r.CacheWrite), nanos(r.Reasoning), b2u(r.HasReasoning),
			r.SetBy, r.SetAt.UTC(), r.SetID, r.Note)
	})
}

// LoadPrices reads every price row in the order catalog versions apply them: by
// catalog_version, then set_at and set_id (two writers of one version).
func (s *Store) LoadPrices(ctx context.Context) ([]PriceRow, error) {
	rows, err := s.conn.Query(ctx, "SELECT "+priceCols+" FROM "+s.db+".prices ORDER BY catalog_version, set_at, set_id, model, effective")
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.prices: %w", s.db, err)
	}
	defer rows.Close()
	var out []PriceRow
	for rows.Next() {
		var r PriceRow
		var in, o, cr, cw, re decimal.Decimal
		var hasR uint8
		if err := rows.Scan(&r.CatalogVersion, &r.Model, &r.Effective, &r.Provider, &r.Aliases, &r.Currency,
			&in, &o, &cr, &cw, &re, &hasR, &r.SetBy, &r.SetAt, &r.SetID, &r.Note); err != nil {
			return nil, fmt.Errorf("cannot read %s.prices: %w", s.db, err)
		}
		r.Effective, r.SetAt = r.Effective.UTC(), r.SetAt.UTC()
		r.Input, r.Output, r.CacheRead, r.CacheWrite, r.Reasoning = in.Shift(9).IntPart(), o.Shift(9).IntPart(),
			cr.Shift(9).IntPart(), cw.Shift(9).IntPart(), re.Shift(9).IntPart()
		r.HasReasoning = hasR == 1
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read %s.prices: %w", s.db, err)
	}
	return out, nil
}

// PricesState is the newest catalog version stored and the number of price rows: a
// cheap check of whether the prices changed since they were last read.
func (s *Store) PricesState(ctx context.Context) (version, rows uint64, err error) {
	if err := s.conn.QueryRow(ctx, "SELECT max(catalog_version), count() FROM "+s.db+".prices").Scan(&version, &rows); err != nil {
		return 0, 0, fmt.Errorf("cannot read the catalog version of %s.prices: %w", s.db, err)
	}
	return version, rows, nil
}
