package prices

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// Bounds of a price upsert.
const (
	// MaxModelBytes bounds a model name: the bound of a usage event's model, so that
	// every model usage can name can be priced.
	MaxModelBytes = schema.MaxIDBytes
	// MaxEntries bounds the entries (model × effective time) of a catalog.
	MaxEntries = 10_000
	// MaxEffectiveAhead is how far in the future a price may take effect.
	MaxEffectiveAhead = 366 * 24 * time.Hour
)

// MinEffective is the earliest effective time a price may have.
var MinEffective = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// entryKey names one entry of a catalog: a model's prices from one effective time.
type entryKey struct {
	model     string
	effective int64 // Unix seconds
}

func keyOf(model string, effective time.Time) entryKey {
	return entryKey{model: model, effective: effective.Unix()}
}

// fold builds catalog version upTo (0: the newest) from the rows in the order
// LoadPrices reads them: for each (model, effective), the last row at or below upTo.
// It returns the catalog, the row behind each of its entries, and the version.
func fold(rows []store.PriceRow, upTo uint64) (*pricing.Catalog, map[entryKey]store.PriceRow, uint64, error) {
	var version uint64
	var order []entryKey
	meta := map[entryKey]store.PriceRow{}
	currency := ""
	for _, r := range rows {
		if upTo > 0 && r.CatalogVersion > upTo {
			continue
		}
		version = max(version, r.CatalogVersion)
		k := keyOf(r.Model, r.Effective)
		if _, ok := meta[k]; !ok {
			order = append(order, k)
		}
		meta[k] = r
		if currency == "" {
			currency = r.Currency
		} else if r.Currency != currency {
			return nil, nil, 0, fmt.Errorf("version %d sets model %q in %s, the catalog is in %s", r.CatalogVersion, r.Model, r.Currency, currency)
		}
	}
	if version == 0 && len(meta) == 0 {
		return nil, nil, 0, errors.New("no prices")
	}
	prices := make([]pricing.Price, 0, len(order))
	for _, k := range order {
		prices = append(prices, priceOf(meta[k]))
	}
	cat, err := pricing.New(strconv.FormatUint(version, 10), currency, prices)
	if err != nil {
		return nil, nil, 0, err
	}
	return cat, meta, version, nil
}

func priceOf(r store.PriceRow) pricing.Price {
	return pricing.Price{Model: r.Model, Aliases: r.Aliases, Provider: r.Provider, Input: r.Input, Output: r.Output,
		CacheRead: r.CacheRead, CacheWrite: r.CacheWrite, Reasoning: r.Reasoning, HasReasoning: r.HasReasoning, Effective: r.Effective}
}

func rowOf(p pricing.Price, currency string) store.PriceRow {
	return store.PriceRow{Model: p.Model, Effective: p.Effective.UTC(), Provider: p.Provider, Aliases: slices.Clone(p.Aliases),
		Currency: currency, Input: p.Input, Output: p.Output, CacheRead: p.CacheRead, CacheWrite: p.CacheWrite,
		Reasoning: p.Reasoning, HasReasoning: p.HasReasoning}
}

// PriceInput is one model's prices to set, as a client sends them.
type PriceInput struct {
	Model string `json:"model"`
	// Prices per million tokens, decimal strings ("3", "0.075"): at most 9 decimal
	// places, at most pricing.MaxPricePerMillion. Input and Output are required; an
	// empty CacheRead or CacheWrite bills those tokens at the input price.
	Input      string `json:"input_per_mtok"`
	Output     string `json:"output_per_mtok"`
	CacheRead  string `json:"cache_read_per_mtok,omitempty"`
	CacheWrite string `json:"cache_write_per_mtok,omitempty"`
	// Currency is a 3-letter code and must be the catalog's (costs of different
	// currencies cannot be summed); "" is the catalog's.
	Currency string `json:"currency,omitempty"`
	// Effective is when the prices start to apply, to the second; zero: now. Usage
	// before it keeps the model's earlier prices. Within [MinEffective, now +
	// MaxEffectiveAhead].
	Effective time.Time `json:"effective,omitzero"`
}

// PriceVersion is one entry of a catalog version: a model's prices from Effective on,
// and which upsert set them.
type PriceVersion struct {
	CatalogVersion uint64   `json:"catalog_version"` // the version that set this entry
	Model          string   `json:"model"`
	Aliases        []string `json:"aliases,omitempty"`
	Provider       string   `json:"provider,omitempty"`
	Currency       string   `json:"currency"`
	// Decimal strings of currency units per million tokens.
	Input      string    `json:"input_per_mtok"`
	Output     string    `json:"output_per_mtok"`
	CacheRead  string    `json:"cache_read_per_mtok"`
	CacheWrite string    `json:"cache_write_per_mtok"`
	Reasoning  string    `json:"reasoning_per_mtok,omitempty"` // only for a model that bills reasoning apart
	Effective  time.Time `json:"effective"`
	SetBy      string    `json:"set_by"` // an API key id, or who ran the CLI; bandplane-prices for the seed
	SetAt      time.Time `json:"set_at"`
}

func versionOf(r store.PriceRow) PriceVersion {
	v := PriceVersion{CatalogVersion: r.CatalogVersion, Model: r.Model, Aliases: r.Aliases, Provider: r.Provider, Currency: r.Currency,
		Input: pricing.FormatPrice(r.Input), Output: pricing.FormatPrice(r.Output), CacheRead: pricing.FormatPrice(r.CacheRead),
		CacheWrite: pricing.FormatPrice(r.CacheWrite), Effective: r.Effective.UTC(), SetBy: r.SetBy, SetAt: r.SetAt.UTC()}
	if r.HasReasoning {
		v.Reasoning = pricing.FormatPrice(r.Reasoning)
	}
	return v
}

var currencyRe = regexp.MustCompile(`^[A-Z]{3}$`)

// checkModel says what is wrong with a model name, if anything: it must be what a
// usage event can carry (at most MaxModelBytes, valid UTF-8) and plain text a person
// can read back — no control or format characters (bidi overrides, zero-width spaces),
// no whitespace but single inner spaces — and not "unknown", the model of usage nobody
// named.
func checkModel(m string) error {
	switch {
	case m == "":
		return fieldErr("model", "required")
	case len(m) > MaxModelBytes:
		return fieldErr("model", "%d bytes is longer than the limit of %d", len(m), MaxModelBytes)
	case !utf8.ValidString(m):
		return fieldErr("model", "not valid UTF-8")
	case strings.EqualFold(m, ingest.Unknown):
		return fieldErr("model", "%q is reserved for usage without a model", m)
	case strings.TrimSpace(m) != m:
		return fieldErr("model", "%q has spaces around it", m)
	case strings.Contains(m, "  "):
		return fieldErr("model", "%q has two spaces in a row", m)
	}
	for i, r := range m {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || (unicode.IsSpace(r) && r != ' ') || r == utf8.RuneError {
			return fieldErr("model", "%q has a control, format or space character (%U) at byte %d", m, r, i)
		}
	}
	return nil
}

// checkBy says what is wrong with who acts (an API key id, or the CLI's --by).
func checkBy(by string) error {
	switch {
	case by == "":
		return fieldErr("by", "who acts is empty")
	case len(by) > schema.MaxIDBytes:
		return fieldErr("by", "%d bytes is longer than the limit of %d", len(by), schema.MaxIDBytes)
	case !utf8.ValidString(by):
		return fieldErr("by", "not valid UTF-8")
	}
	for i, r := range by {
		if unicode.IsControl(r) {
			return fieldErr("by", "control character at byte %d", i)
		}
	}
	return nil
}

// entry validates in against the catalog cur at now and returns the entry to store.
// Every problem is reported, each naming its field.
func entry(cur *pricing.Catalog, in PriceInput, now time.Time) (pricing.Price, error) {
	var errs []error
	if err := checkModel(in.Model); err != nil {
		errs = append(errs, err)
	} else if canon, ok := cur.Canonical(in.Model); ok && canon != in.Model {
		if strings.EqualFold(canon, in.Model) {
			errs = append(errs, fieldErr("model", "%q differs only in case from the catalog's %q: use that name", in.Model, canon))
		} else {
			errs = append(errs, fieldErr("model", "%q is an alias of %q: set the price of %q", in.Model, canon, canon))
		}
	}
	p := pricing.Price{Model: in.Model}
	price := func(field, s string, required bool) int64 {
		if s == "" && !required {
			return -1
		}
		if s == "" {
			errs = append(errs, fieldErr(field, "required (a decimal string of %s per million tokens)", cur.Currency()))
			return 0
		}
		n, err := pricing.ParsePrice(s)
		if err != nil {
			errs = append(errs, fieldErr(field, "%v", err))
		}
		return n
	}
	p.Input = price("input", in.Input, true)
	p.Output = price("output", in.Output, true)
	if p.CacheRead = price("cache_read", in.CacheRead, false); p.CacheRead < 0 {
		p.CacheRead = p.Input
	}
	if p.CacheWrite = price("cache_write", in.CacheWrite, false); p.CacheWrite < 0 {
		p.CacheWrite = p.Input
	}
	switch {
	case in.Currency == "":
	case !currencyRe.MatchString(in.Currency):
		errs = append(errs, fieldErr("currency", "%q is not a 3-letter currency code (ISO 4217, upper case)", cut(in.Currency)))
	case in.Currency != cur.Currency():
		errs = append(errs, fieldErr("currency", "%s: the catalog's prices are in %s, and costs in two currencies cannot be summed", in.Currency, cur.Currency()))
	}
	p.Effective = in.Effective.UTC().Truncate(time.Second)
	if in.Effective.IsZero() {
		p.Effective = now.UTC().Truncate(time.Second)
	} else if p.Effective.Before(MinEffective) || p.Effective.After(now.Add(MaxEffectiveAhead)) {
		errs = append(errs, fieldErr("effective", "%s is outside [%s, now + %d days]", in.Effective.UTC().Format(time.RFC3339),
			MinEffective.Format(time.DateOnly), int(MaxEffectiveAhead/(24*time.Hour))))
	}
	if len(errs) > 0 {
		return pricing.Price{}, errors.Join(errs...)
	}
	// The model's aliases and provider stay; so does how it bills reasoning tokens (the
	// entry in effect then, else its first), which the API does not set.
	if h := cur.History(in.Model); len(h) > 0 {
		base := h[0]
		if at, ok := cur.PriceAt(in.Model, p.Effective); ok {
			base = at
		}
		p.Aliases, p.Provider, p.HasReasoning, p.Reasoning = base.Aliases, base.Provider, base.HasReasoning, base.Reasoning
	}
	return p, nil
}

func cut(s string) string {
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}

// UpsertPrice sets one model's prices from in.Effective on, as a new catalog version
// (the previous one with this entry added or replaced), and writes its price.set
// event. Prices are platform-wide: only a platform key with role admin may change
// them (an organization's admin would change every tenant's costs). Ingest in this
// process prices with the new version at once, every other serve within its refresh
// (2 s). Usage already stored keeps its cost until a reprice job covers it.
func (s *Service) UpsertPrice(ctx context.Context, by keys.Key, in PriceInput) (PriceVersion, error) {
	if !by.Platform() || !by.Has(keys.RoleAdmin) {
		return PriceVersion{}, fmt.Errorf("%w: prices are platform-wide: only a platform key with role admin may change them (key %s is a %s key of %q)",
			schema.ErrForbidden, by.ID, by.Role, by.Org)
	}
	return s.SetPrice(ctx, by.ID, in)
}

// SetPrice is UpsertPrice for a trusted caller (`bandplane prices set`, which has
// ClickHouse's credentials): by is recorded as who set the price.
func (s *Service) SetPrice(ctx context.Context, by string, in PriceInput) (PriceVersion, error) {
	if err := checkBy(by); err != nil {
		return PriceVersion{}, err
	}
	if s.cfg.ReadOnly {
		return PriceVersion{}, errors.New("the price service is read-only")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// On the newest version in ClickHouse, not the one read up to 2 s ago: another
	// process may have written since.
	if err := s.reload(ctx, false); err != nil {
		return PriceVersion{}, err
	}
	now := s.cfg.Now()
	p, err := entry(s.cat, in, now)
	if err != nil {
		return PriceVersion{}, err
	}
	if len(s.meta) >= MaxEntries {
		if _, replaces := s.meta[keyOf(p.Model, p.Effective)]; !replaces {
			return PriceVersion{}, fmt.Errorf("%w: the catalog has %d entries, the most it may have", schema.ErrConflict, len(s.meta))
		}
	}
	r := rowOf(p, s.cat.Currency())
	r.CatalogVersion, r.SetBy, r.SetAt, r.SetID = s.version+1, by, now.UTC().Truncate(time.Second), newID()
	rows := append(slices.Clone(s.rows), r)
	cat, meta, version, err := fold(rows, 0)
	if err != nil {
		return PriceVersion{}, fmt.Errorf("cannot set the price of %q: %w", p.Model, err)
	}
	data := PriceEventData{CatalogVersion: version, Price: versionOf(r)}
	if prev, ok := s.cat.PriceAt(p.Model, p.Effective); ok {
		if pr, ok := s.meta[keyOf(prev.Model, prev.Effective)]; ok {
			pv := versionOf(pr)
			data.Previous = &pv
		}
	}
	// The event first, as for keys: no price applies without its audit event. If the
	// insert fails after it, the trail tells of a version that never existed, which
	// changes no cost.
	if err := s.audit(ctx, event(TypePriceSet, "", by, p.Model, now, data)); err != nil {
		return PriceVersion{}, err
	}
	if err := s.st.InsertPrices(ctx, []store.PriceRow{r}); err != nil {
		return PriceVersion{}, err
	}
	s.cat, s.meta, s.version, s.rows = cat, meta, version, rows
	s.state = [2]uint64{0, 0} // the next Refresh reads the table again
	s.live.Set(cat)
	s.m.version.Set(float64(version))
	s.log.Info("price set", "catalog_version", version, "model", p.Model, "effective", p.Effective, "by", by)
	return versionOf(r), nil
}

// ListPrices returns the entries of the newest catalog version, by model then
// effective time, each with the version that set it.
func (s *Service) ListPrices(ctx context.Context) ([]PriceVersion, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.reload(ctx, false); err != nil {
		return nil, err
	}
	out := []PriceVersion{}
	for _, p := range s.cat.Prices() {
		r, ok := s.meta[keyOf(p.Model, p.Effective)]
		if !ok { // the seed served from memory
			r = rowOf(p, s.cat.Currency())
		}
		out = append(out, versionOf(r))
	}
	slices.SortFunc(out, func(a, b PriceVersion) int {
		if c := strings.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		return a.Effective.Compare(b.Effective)
	})
	return out, nil
}

// catalogAt is catalog version v (a job's pinned version).
func (s *Service) catalogAt(ctx context.Context, v uint64) (*pricing.Catalog, error) {
	s.mu.Lock()
	if v == s.version && s.cat != nil {
		defer s.mu.Unlock()
		return s.cat, nil
	}
	s.mu.Unlock()
	rows, err := s.st.LoadPrices(ctx)
	if err != nil {
		return nil, err
	}
	cat, _, got, err := fold(rows, v)
	if err != nil {
		return nil, fmt.Errorf("cannot build catalog version %d: %w", v, err)
	}
	if got != v {
		return nil, fmt.Errorf("catalog version %d is not in %s.prices (the newest at or below it is %d)", v, s.cfg.Database, got)
	}
	return cat, nil
}
