// Package pricing is bandplane's price catalog: list prices per million tokens for each
// model, and the exact cost of one usage event.
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
	"sort"
	"strings"
	"sync"
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

// Price is one model's prices, in nano-units of the currency per million tokens.
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
	Effective    time.Time
}

// Catalog is a validated, immutable price catalog. It is safe for concurrent use.
type Catalog struct {
	version  string
	currency string
	models   []Price        // in file order
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
	c := &Catalog{
		version:  f.Version,
		currency: f.Currency,
		byName:   make(map[string]int),
		lower:    make(map[string]int),
	}
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
		} else if p.Effective, err = time.Parse(time.DateOnly, m.Effective); err != nil {
			errs = append(errs, fmt.Errorf("%s: effective: %q is not a YYYY-MM-DD date", where, m.Effective))
		}
		idx := len(c.models)
		for _, n := range append([]string{name}, m.Aliases...) {
			n = strings.TrimSpace(n)
			if n == "" {
				if name != "" {
					errs = append(errs, fmt.Errorf("%s: aliases: empty alias", where))
				}
				continue
			}
			if _, dup := c.byName[n]; dup {
				errs = append(errs, fmt.Errorf("%s: duplicate model %q", where, n))
				continue
			}
			c.byName[n] = idx
			if _, dup := c.lower[strings.ToLower(n)]; !dup {
				c.lower[strings.ToLower(n)] = idx
			}
		}
		c.models = append(c.models, p)
		if name != "" {
			c.names = append(c.names, name)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	sort.Strings(c.names)
	return c, nil
}

func parsePrice(a amount, required bool) (int64, error) {
	if !a.set {
		if required {
			return 0, errors.New("missing")
		}
		return 0, nil
	}
	d, err := decimal.NewFromString(strings.TrimSpace(a.s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a decimal", a.s)
	}
	if d.IsNegative() {
		return 0, fmt.Errorf("%q is negative", a.s)
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

// Source gives the catalog to price with now: a *Catalog gives itself; a catalog kept
// current from ClickHouse gives its latest version.
type Source interface {
	Current() *Catalog
}

// Current is the catalog itself (a *Catalog is a Source that never changes).
func (c *Catalog) Current() *Catalog { return c }

// Version is the catalog's version string.
func (c *Catalog) Version() string { return c.version }

// Currency is the catalog's currency code, e.g. "USD".
func (c *Catalog) Currency() string { return c.currency }

// Models returns the catalog's canonical model names (not aliases), sorted.
func (c *Catalog) Models() []string { return append([]string(nil), c.names...) }

// Lookup returns the prices of a model, by name or alias; an exact match wins over a
// case-insensitive one.
func (c *Catalog) Lookup(model string) (Price, bool) {
	if c == nil || model == "" {
		return Price{}, false
	}
	i, ok := c.byName[model]
	if !ok {
		i, ok = c.lower[strings.ToLower(strings.TrimSpace(model))]
	}
	if !ok {
		return Price{}, false
	}
	return c.models[i], true
}

// Cost is the price of one usage event in micro-units (10⁻⁶) of the catalog's currency,
// exact and rounded half up once. priced is false, and micros 0, for an empty or unknown
// model, for a negative token count, and if the cost does not fit in an int64.
// usage.Model is ignored: the caller passes the model it resolved.
func (c *Catalog) Cost(model string, u schema.UsageData) (micros int64, priced bool) {
	p, ok := c.Lookup(model)
	if !ok {
		return 0, false
	}
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
