// Package pricing is bandplane's price catalog: list prices per million tokens for each
// model over time, and the exact cost of one usage event at the time it happened.
//
// # Catalog format
//
//	{"version": "2026-11-01", "currency": "USD", "models": [
//	  {"model": "claude-sonnet-4-5", "aliases": ["claude-sonnet-4-5-20250929"],
//	   "input_per_mtok": "3.00", "output_per_mtok": "15.00",
//	   "cache_read_per_mtok": "0.30", "cache_write_per_mtok": "3.75",
//	   "effective": "2025-09-29"}]}
//
// Prices are decimal strings (JSON numbers are accepted too) with at most 9 decimal
// places, in the catalog's currency per million tokens, at most MaxPricePerMillion. input and output prices are
// required; a missing cache_read or cache_write price bills those tokens at the input
// price. reasoning_per_mtok is optional, see below. Unknown fields are ignored.
//
// # Effective time
//
// A model may be listed more than once with different effective times (a date, or an
// RFC 3339 time): its price history. Usage at time t is priced with the model's entry
// whose effective time is the latest at or before t. Usage before the model's first
// effective time is unpriced (stored with its tokens and no cost, like usage of an
// unknown model, and listed as unpriced), never priced with a price that was not in
// effect yet: to price it, set a price with an earlier effective time and reprice.
// Cost, without a time, prices at the time of the call (what a budget estimate of
// usage happening now needs).
//
// # Token kinds
//
// The usage event's kinds are disjoint, as the platform reports them: input_tokens are
// the prompt tokens that were neither read from nor written to the cache, and each cache
// kind is billed at its own price.
//
// Reasoning tokens: every provider in the default catalog (Anthropic, OpenAI, Google)
// already counts reasoning ("thinking") tokens inside output_tokens and bills them at the
// output price, so by default reasoning_tokens are NOT billed again. A model whose
// provider reports reasoning tokens apart from output and bills them separately sets
// reasoning_per_mtok; only then are reasoning tokens added, at that price.
//
// # Arithmetic
//
// Prices are held as integer nano-units (10⁻⁹ of the currency unit) per million tokens,
// so tokens × price is an exact integer count of 10⁻¹⁵ units, i.e. 10⁻⁹ micro-units. The
// per-kind products are summed exactly in 128 bits and the total is rounded once per
// event, half up, to the micro-unit (10⁻⁶ of the currency unit).
//
// With every count at most schema.MaxTokens (10⁹) and every price at most
// MaxPricePerMillion (10⁶), one kind costs at most 10⁹ units and a report of five kinds
// (input, output, both cache kinds, reasoning when billed apart) at most 5·10⁹ units,
// 5·10¹⁵ micro-units: far inside an int64 and inside the Decimal(18,6) (< 10¹² units)
// of a usage row.
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package pricing

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/shopspring/decimal"
)

//go:embed catalog.json
var defaultCatalog []byte

// nanoPerUnit is the scale of a stored price: nano-units of currency per million tokens.
const nanoPerUnit = 1_000_000_000

// maxScale is the most decimal places a price may have.
const maxScale = 9

// MaxPricePerMillion is the highest price a catalog may set, in currency units per
// million tokens (any kind): 1,000,000, some 10,000 times the dearest list price today.
// With schema.MaxTokens it bounds the cost of one report (see the package doc).
const MaxPricePerMillion = 1_000_000

// MaxPriceNanos is MaxPricePerMillion in nano-units, the unit of Price's fields.
const MaxPriceNanos = MaxPricePerMillion * nanoPerUnit

// Price is one model's prices from its effective time on, in nano-units of the
// currency per million tokens.
type Price struct {
	Model      string
	Aliases    []string
	Provider   string
	Input      int64
	Output     int64
	CacheRead  int64
	CacheWrite int64
	// Reasoning is the separate price of reasoning tokens; HasReasoning is false when
	// reasoning tokens are part of the output tokens (the default) and not billed again.
	Reasoning    int64
	HasReasoning bool
	Effective    time.Time // UTC
}

// model is one model's price history, sorted by Effective, oldest first. Every entry
// carries the model's name, aliases and provider.
type model struct {
	history []Price
}

// Catalog is a validated, immutable price catalog. It is safe for concurrent use.
type Catalog struct {
	version  string
	currency string
	models   []model        // in file order
	byName   map[string]int // model name and aliases → index in models
	lower    map[string]int // lower-cased names, for a case-insensitive fallback
	names    []string       // canonical model names, sorted
}

var (
	defaultOnce sync.Once
	defaultCat  *Catalog
)

// Default returns the embedded default catalog. It panics if the embedded file is
// invalid, which the package's tests rule out.
func Default() *Catalog {
	defaultOnce.Do(func() {
		c, err := Parse(defaultCatalog)
		if err != nil {
			panic("pricing: embedded catalog.json: " + err.Error())
		}
		defaultCat = c
	})
	return defaultCat
}

// Load reads and parses a catalog file.
func Load(path string) (*Catalog, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pricing: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("pricing: %s: %w", path, err)
	}
	return c, nil
}

// amount is a price as written in the file: a JSON string or number.
type amount struct {
	set bool
	s   string
}

func (a *amount) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		a.set, a.s = true, s
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("price must be a decimal string or number, got %s", b)
	}
	a.set, a.s = true, n.String()
	return nil
}

type fileModel struct {
	Model      string   `json:"model"`
	Provider   string   `json:"provider"`
	Aliases    []string `json:"aliases"`
	Input      amount   `json:"input_per_mtok"`
	Output     amount   `json:"output_per_mtok"`
	CacheRead  amount   `json:"cache_read_per_mtok"`
	CacheWrite amount   `json:"cache_write_per_mtok"`
	Reasoning  amount   `json:"reasoning_per_mtok"`
	Effective  string   `json:"effective"`
}

type file struct {
	Version  string      `json:"version"`
	Currency string      `json:"currency"`
	Models   []fileModel `json:"models"`
}

// Parse parses and validates a catalog. All problems are reported together
// (errors.Join), each naming the model and the field.
func Parse(b []byte) (*Catalog, error) {
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("invalid catalog JSON: %w", err)
	}
	var errs []error
	if strings.TrimSpace(f.Version) == "" {
		errs = append(errs, errors.New("version: missing"))
	}
	if strings.TrimSpace(f.Currency) == "" {
		errs = append(errs, errors.New("currency: missing"))
	}
	if len(f.Models) == 0 {
		errs = append(errs, errors.New("models: empty"))
	}
	var prices []Price
	for i, m := range f.Models {
		name := strings.TrimSpace(m.Model)
		where := fmt.Sprintf("model %q", name)
		if name == "" {
			where = fmt.Sprintf("models[%d]", i)
			errs = append(errs, fmt.Errorf("%s: model: missing", where))
		}
		p := Price{Model: name, Provider: m.Provider, Aliases: m.Aliases}
		var err error
		if p.Input, err = parsePrice(m.Input, true); err != nil {
			errs = append(errs, fmt.Errorf("%s: input_per_mtok: %w", where, err))
		}
		if p.Output, err = parsePrice(m.Output, true); err != nil {
			errs = append(errs, fmt.Errorf("%s: output_per_mtok: %w", where, err))
		}
		p.CacheRead, p.CacheWrite = p.Input, p.Input
		if m.CacheRead.set {
			if p.CacheRead, err = parsePrice(m.CacheRead, true); err != nil {
				errs = append(errs, fmt.Errorf("%s: cache_read_per_mtok: %w", where, err))
			}
		}
		if m.CacheWrite.set {
			if p.CacheWrite, err = parsePrice(m.CacheWrite, true); err != nil {
				errs = append(errs, fmt.Errorf("%s: cache_write_per_mtok: %w", where, err))
			}
		}
		if m.Reasoning.set {
			p.HasReasoning = true
			if p.Reasoning, err = parsePrice(m.Reasoning, true); err != nil {
				errs = append(errs, fmt.Errorf("%s: reasoning_per_mtok: %w", where, err))
			}
		}
		if strings.TrimSpace(m.Effective) == "" {
			errs = append(errs, fmt.Errorf("%s: effective: missing", where))
		} else if p.Effective, err = parseEffective(m.Effective); err != nil {
			errs = append(errs, fmt.Errorf("%s: effective: %q is not a YYYY-MM-DD date (or an RFC 3339 time)", where, m.Effective))
		}
		if name != "" && !p.Effective.IsZero() {
			prices = append(prices, p) // for the checks across models, even with errors above
		}
	}
	c, more := build(f.Version, f.Currency, prices)
	if errs = append(errs, more...); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

func parseEffective(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	return t.UTC(), err
}

// New builds a catalog from its entries. Entries of one model (by Model) are its price
// history: their aliases are merged, the last non-empty provider wins, and two entries
// of a model with the same effective time are an error. A name or alias may belong to
// one model only. All problems are reported together.
func New(version, currency string, prices []Price) (*Catalog, error) {
	var errs []error
	if strings.TrimSpace(version) == "" {
		errs = append(errs, errors.New("version: missing"))
	}
	if strings.TrimSpace(currency) == "" {
		errs = append(errs, errors.New("currency: missing"))
	}
	if len(prices) == 0 {
		errs = append(errs, errors.New("models: empty"))
	}
	c, more := build(version, currency, prices)
	if errs = append(errs, more...); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// build is New without the checks of the version, currency and count.
func build(version, currency string, prices []Price) (*Catalog, []error) {
	var errs []error
	c := &Catalog{version: version, currency: currency, byName: map[string]int{}, lower: map[string]int{}}
	index := map[string]int{} // canonical name → index in c.models
	for _, p := range prices {
		name := p.Model
		where := fmt.Sprintf("model %q", name)
		if strings.TrimSpace(name) == "" || name != strings.TrimSpace(name) {
			errs = append(errs, fmt.Errorf("%s: model: empty or with spaces around it", where))
			continue
		}
		for _, f := range []struct {
			field string
			v     int64
		}{{"input_per_mtok", p.Input}, {"output_per_mtok", p.Output}, {"cache_read_per_mtok", p.CacheRead},
			{"cache_write_per_mtok", p.CacheWrite}, {"reasoning_per_mtok", p.Reasoning}} {
			if f.v < 0 || f.v > MaxPriceNanos {
				errs = append(errs, fmt.Errorf("%s: %s: %s is outside [0, %d]", where, f.field, FormatPrice(f.v), MaxPricePerMillion))
			}
		}
		if p.Effective.IsZero() {
			errs = append(errs, fmt.Errorf("%s: effective: missing", where))
		}
		p.Effective = p.Effective.UTC()
		idx, known := index[name]
		if !known {
			if other, taken := c.byName[name]; taken {
				errs = append(errs, fmt.Errorf("%s: duplicate model %q (an alias of %q)", where, name, c.models[other].history[0].Model))
				continue
			}
			idx = len(c.models)
			index[name] = idx
			c.models = append(c.models, model{})
			c.names = append(c.names, name)
			c.byName[name] = idx
		}
		m := &c.models[idx]
		dup := false
		for _, h := range m.history {
			if h.Effective.Equal(p.Effective) {
				errs = append(errs, fmt.Errorf("%s: duplicate model %q at effective %s", where, name, p.Effective.Format(time.RFC3339)))
				dup = true
			}
		}
		if dup {
			continue
		}
		for _, a := range p.Aliases {
			a = strings.TrimSpace(a)
			if a == "" {
				errs = append(errs, fmt.Errorf("%s: aliases: empty alias", where))
				continue
			}
			if other, taken := c.byName[a]; taken && other != idx {
				errs = append(errs, fmt.Errorf("%s: duplicate model %q", where, a))
				continue
			}
			c.byName[a] = idx
		}
		p.Aliases = nil
		m.history = append(m.history, p)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	// Every entry of a model carries its aliases (all of them) and provider.
	aliases := make([][]string, len(c.models))
	for n, i := range c.byName {
		if n != c.models[i].history[0].Model {
			aliases[i] = append(aliases[i], n)
		}
	}
	for i := range c.models {
		m := &c.models[i]
		sort.Slice(m.history, func(a, b int) bool { return m.history[a].Effective.Before(m.history[b].Effective) })
		sort.Strings(aliases[i])
		provider := ""
		for _, h := range m.history {
			if h.Provider != "" {
				provider = h.Provider
			}
		}
		for j := range m.history {
			m.history[j].Aliases, m.history[j].Provider = aliases[i], provider
		}
	}
	// Lower-cased names in the order models were listed, so that the first one listed
	// wins a case-insensitive tie, whatever the map order.
	for i := range c.models {
		names := append([]string{c.models[i].history[0].Model}, aliases[i]...)
		for _, n := range names {
			if _, dup := c.lower[strings.ToLower(n)]; !dup {
				c.lower[strings.ToLower(n)] = i
			}
		}
	}
	sort.Strings(c.names)
	return c, nil
}

// plainDecimal is the text a price may be: digits, a fraction, a small exponent (JSON
// numbers); anything longer or stranger is refused before a decimal is built from it
// (an exponent of -2³¹ would make the rounding check compute 10^2147483648).
var plainDecimal = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]{1,3})?$`)

// maxPriceText bounds the text of a price.
const maxPriceText = 64

// ParsePrice reads a price per million tokens written as a decimal string, in
// nano-units: at most 9 decimal places, in [0, MaxPricePerMillion]. The error says
// what is wrong with s (quoted).
func ParsePrice(s string) (int64, error) {
	return parsePrice(amount{set: true, s: s}, true)
}

func parsePrice(a amount, required bool) (int64, error) {
	if !a.set {
		if required {
			return 0, errors.New("missing")
		}
		return 0, nil
	}
	s := strings.TrimSpace(a.s)
	if len(s) > maxPriceText {
		return 0, fmt.Errorf("%q is longer than %d characters", a.s[:maxPriceText]+"…", maxPriceText)
	}
	if strings.HasPrefix(s, "-") && plainDecimal.MatchString(s[1:]) {
		return 0, fmt.Errorf("%q is negative", a.s)
	}
	if !plainDecimal.MatchString(s) {
		return 0, fmt.Errorf("%q is not a decimal", a.s)
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a decimal", a.s)
	}
	if d.GreaterThan(decimal.NewFromInt(MaxPricePerMillion)) {
		return 0, fmt.Errorf("%q is above the cap of %d per million tokens", a.s, MaxPricePerMillion)
	}
	if -d.Exponent() > maxScale && !d.Equal(d.Truncate(maxScale)) {
		return 0, fmt.Errorf("%q has more than %d decimal places", a.s, maxScale)
	}
	n := d.Shift(maxScale).BigInt()
	if !n.IsInt64() {
		return 0, fmt.Errorf("%q is too large", a.s)
	}
	return n.Int64(), nil
}

// FormatPrice writes a price in nano-units as a decimal string of currency units per
// million tokens, without trailing zeros ("3", "0.075").
func FormatPrice(nanos int64) string { return decimal.New(nanos, -maxScale).String() }

// PriceDecimal is a price in nano-units as a decimal of currency units.
func PriceDecimal(nanos int64) decimal.Decimal { return decimal.New(nanos, -maxScale) }

// Source gives the catalog to price with now: a *Catalog gives itself; a catalog kept
// current from ClickHouse gives its latest version. Current never blocks and never
// returns nil.
type Source interface {
	Current() *Catalog
}

// Current is the catalog itself (a *Catalog is a Source that never changes).
func (c *Catalog) Current() *Catalog { return c }

// Live is a Source whose catalog is replaced as new versions arrive (the price service
// sets it from ClickHouse). Current is one atomic load: ingest calls it per event.
type Live struct {
	cur atomic.Pointer[Catalog]
}

// NewLive returns a Live starting at c, which must not be nil.
func NewLive(c *Catalog) *Live {
	if c == nil {
		panic("pricing: NewLive(nil)")
	}
	l := &Live{}
	l.cur.Store(c)
	return l
}

// Current is the latest catalog set.
func (l *Live) Current() *Catalog { return l.cur.Load() }

// Set makes c the catalog Current returns; nil is ignored.
func (l *Live) Set(c *Catalog) {
	if c != nil {
		l.cur.Store(c)
	}
}

// Version is the catalog's version string.
func (c *Catalog) Version() string { return c.version }

// Currency is the catalog's currency code, e.g. "USD".
func (c *Catalog) Currency() string { return c.currency }

// Models returns the catalog's canonical model names (not aliases), sorted.
func (c *Catalog) Models() []string { return append([]string(nil), c.names...) }

// Prices returns every entry: the models in the order they were listed, each model's
// history oldest first.
func (c *Catalog) Prices() []Price {
	var out []Price
	for _, m := range c.models {
		out = append(out, m.history...)
	}
	return out
}

// History returns the entries of a model (by name or alias), oldest first.
func (c *Catalog) History(model string) []Price {
	i, ok := c.index(model)
	if !ok {
		return nil
	}
	return append([]Price(nil), c.models[i].history...)
}

// Canonical returns the canonical name of a model given by name or alias, exactly or
// ignoring case.
func (c *Catalog) Canonical(model string) (string, bool) {
	i, ok := c.index(model)
	if !ok {
		return "", false
	}
	return c.models[i].history[0].Model, true
}

func (c *Catalog) index(model string) (int, bool) {
	if c == nil || model == "" {
		return 0, false
	}
	i, ok := c.byName[model]
	if !ok {
		i, ok = c.lower[strings.ToLower(strings.TrimSpace(model))]
	}
	return i, ok
}

// Lookup returns the prices of a model in effect now, by name or alias; an exact match
// wins over a case-insensitive one.
func (c *Catalog) Lookup(model string) (Price, bool) { return c.PriceAt(model, time.Now()) }

// PriceAt returns the prices of a model in effect at t: its entry whose effective time
// is the latest at or before t. There is none before the model's first effective time.
func (c *Catalog) PriceAt(model string, t time.Time) (Price, bool) {
	i, ok := c.index(model)
	if !ok {
		return Price{}, false
	}
	h := c.models[i].history
	// The first entry effective after t; the one before it is in effect.
	j := sort.Search(len(h), func(k int) bool { return h[k].Effective.After(t) })
	if j == 0 {
		return Price{}, false
	}
	return h[j-1], true
}

// Cost is CostAt now: the price of usage happening at the time of the call.
func (c *Catalog) Cost(model string, u schema.UsageData) (micros int64, priced bool) {
	return c.CostAt(model, time.Now(), u)
}

// CostAt is the price of one usage event at time t, in micro-units (10⁻⁶) of the
// catalog's currency, exact and rounded half up once. priced is false, and micros 0,
// for an empty or unknown model, for t before the model's first effective time, for a
// negative token count, and if the cost does not fit in an int64. usage.Model is
// ignored: the caller passes the model it resolved.
func (c *Catalog) CostAt(model string, t time.Time, u schema.UsageData) (micros int64, priced bool) {
	p, ok := c.PriceAt(model, t)
	if !ok {
		return 0, false
	}
	return p.Cost(u)
}

// Cost is the price of one usage event at these prices (see CostAt).
func (p Price) Cost(u schema.UsageData) (micros int64, priced bool) {
	if u.InputTokens < 0 || u.OutputTokens < 0 || u.CacheReadTokens < 0 || u.CacheWriteTokens < 0 {
		return 0, false
	}
	var hi, lo uint64
	add := func(tokens, price int64) {
		h, l := bits.Mul64(uint64(tokens), uint64(price))
		var carry uint64
		lo, carry = bits.Add64(lo, l, 0)
		hi += h + carry
	}
	add(u.InputTokens, p.Input)
	add(u.OutputTokens, p.Output)
	add(u.CacheReadTokens, p.CacheRead)
	add(u.CacheWriteTokens, p.CacheWrite)
	if p.HasReasoning && u.ReasoningTokens != nil {
		if *u.ReasoningTokens < 0 {
			return 0, false
		}
		add(*u.ReasoningTokens, p.Reasoning)
	}
	// Round half up: (sum + 0.5e9) / 1e9.
	var carry uint64
	lo, carry = bits.Add64(lo, nanoPerUnit/2, 0)
	hi += carry
	if hi >= nanoPerUnit {
		return 0, false // quotient would not fit in 64 bits
	}
	q, _ := bits.Div64(hi, lo, nanoPerUnit)
	if q > math.MaxInt64 {
		return 0, false
	}
	return int64(q), true
}
