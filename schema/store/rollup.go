package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/shopspring/decimal"
)

// HourKey names one hour of one organization in the rollup.
type HourKey struct {
	OrgID string
	Hour  time.Time // truncated to the hour, UTC
}

type rollupKey struct {
	owner, agent, room, model string
	// Who set the spend going (schema/cause, usage's chain): the initiator, its type
	// and accountable person, and the chain's depth.
	initiator, initiatorType, initiatorOwner string
	depth                                    uint16
	hour                                     time.Time
}

// The groups of the two rollups: the columns that, with the organization and the
// bucket, make a group, in the order of their keys (a read that takes each group's
// newest row takes it LIMIT 1 BY these). The cost rollup (usage_hourly, usage_rollup)
// groups by owner, agent, room and model; the initiator rollup (initiator_hourly,
// initiator_rollup, migration 010) by owner, model and who set the spend going. They
// are apart because a person's requests reach many agents: one table grouped by both
// holds some ten times the groups, and every cost read would pay for them.
const (
	RollupGroup    = "owner_id, agent_id, room_id, model"
	InitiatorGroup = "owner_id, model, initiator_id, initiator_type, initiator_owner, chain_depth"
)

// rollupSpec is one rollup: its tables and its group's columns.
type rollupSpec struct {
	hourly, rollup string
	group          string
	cols           []string
}

var (
	costRollup      = newRollupSpec("usage_hourly", "usage_rollup", RollupGroup)
	initiatorRollup = newRollupSpec("initiator_hourly", "initiator_rollup", InitiatorGroup)
	// rollups are rebuilt together, in this order.
	rollups = []*rollupSpec{costRollup, initiatorRollup}
)

func newRollupSpec(hourly, rollup, group string) *rollupSpec {
	return &rollupSpec{hourly: hourly, rollup: rollup, group: group, cols: strings.Split(group, ", ")}
}

// dest is what a scan of the group's columns fills, in their order.
func (sp *rollupSpec) dest(k *rollupKey) []any {
	out := make([]any, len(sp.cols))
	for i, c := range sp.cols {
		switch c {
		case "owner_id":
			out[i] = &k.owner
		case "agent_id":
			out[i] = &k.agent
		case "room_id":
			out[i] = &k.room
		case "model":
			out[i] = &k.model
		case "initiator_id":
			out[i] = &k.initiator
		case "initiator_type":
			out[i] = &k.initiatorType
		case "initiator_owner":
			out[i] = &k.initiatorOwner
		case "chain_depth":
			out[i] = &k.depth
		}
	}
	return out
}

// values are the key's group columns, for an insert.
func (sp *rollupSpec) values(k *rollupKey) []any {
	out := sp.dest(k)
	for i, p := range out {
		switch v := p.(type) {
		case *string:
			out[i] = *v
		case *uint16:
			out[i] = *v
		}
	}
	return out
}

// cols are the columns of an hourly table, and those of a rollup table.
func (sp *rollupSpec) hourlyCols() string { return "hour, org_id, " + sp.group + ", " + rollupSums }
func (sp *rollupSpec) rollupCols() string {
	return "grain, bucket, org_id, " + sp.group + ", " + rollupSums
}

// RefreshRollup rebuilds the hourly rollup of the given hours from usage FINAL, so a
// replayed or repriced event is counted once, then their days in usage_rollup from the
// hourly one, with the hours (RefreshDays). Groups that no longer exist in an hour (a
// reprice moved a row from model "unknown" to a real model) are overwritten with zeros.
// It reads one query per organization and day of dirty hours, and writes one insert per
// organization into usage_hourly and one per organization and day into usage_rollup.
func (s *Store) RefreshRollup(ctx context.Context, keys []HourKey) error {
	byOrg := map[string][]time.Time{}
	for _, k := range keys {
		byOrg[k.OrgID] = append(byOrg[k.OrgID], k.Hour.UTC().Truncate(time.Hour))
	}
	orgs := make([]string, 0, len(byOrg))
	for o := range byOrg {
		orgs = append(orgs, o)
	}
	sort.Strings(orgs)
	for _, org := range orgs {
		hours := byOrg[org]
		sort.Slice(hours, func(i, j int) bool { return hours[i].Before(hours[j]) })
		hours = slices.CompactFunc(hours, time.Time.Equal)
		if err := s.refreshOrg(ctx, org, hours); err != nil {
			return err
		}
	}
	return nil
}

// rollupSums are the columns of a rollup row after its group.
const rollupSums = "events, unpriced_events, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens," +
	" unpriced_input_tokens, unpriced_output_tokens, unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost, currency, version"

type rollupRow struct {
	key                                  rollupKey
	events, unpriced, in, out, cr, cw, r uint64
	// The tokens of the unpriced events (kept apart: their cost is unknown, not 0).
	uin, uout, ucr, ucw, ur uint64
	cost                    decimal.Decimal
	currency                string
	// Of a row of usage_rollup: grainHour or grainDay (key.hour is then the day), and
	// the version it is written with. A row read from usage_hourly has its version.
	grain   string
	version uint64
}

// refreshOrg rebuilds the given hours of one organization (sorted), reading one day
// at a time: FINAL reads every part in its range at once, and on 18.16 that costs
// megabytes of buffers per part (a rebuild spanning 250 daily partitions was refused
// at the 4 GiB memory limit); a day is a partition, so a query reads only its parts.
//
// The version of the rows written is the time just before the first read, as for the
// days (RefreshDays): of two processes rebuilding one hour (ingest's rollup, and a
// reprice job that has just rewritten the hour's usage), the one whose read started
// later, and so saw every usage row written before it, wins, whichever writes last.
func (s *Store) refreshOrg(ctx context.Context, org string, hours []time.Time) error {
	for _, sp := range rollups {
		if err := s.refreshSpec(ctx, sp, org, hours); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) refreshSpec(ctx context.Context, sp *rollupSpec, org string, hours []time.Time) error {
	version := uint64(time.Now().UnixNano())
	var fresh []rollupRow
	for start := 0; start < len(hours); {
		end := start + 1
		for end < len(hours) && DayPartition(hours[end]) == DayPartition(hours[start]) {
			end++
		}
		rows, err := s.rebuildHours(ctx, sp, org, hours[start:end])
		if err != nil {
			return err
		}
		fresh = append(fresh, rows...)
		start = end
	}
	if err := s.sendRollup(ctx, sp, org, fresh, version); err != nil {
		return err
	}
	days := make([]time.Time, 0, len(hours))
	rebuilt := make(map[time.Time]bool, len(hours))
	for _, h := range hours {
		days = append(days, h.Truncate(24*time.Hour))
		rebuilt[h] = true
	}
	return s.refreshDays(ctx, sp, org, days, &writtenHours{version: version, hours: rebuilt, rows: fresh})
}

// writtenHours are hours of usage_hourly this process has just rebuilt: their rows
// (zero rows of vanished groups included) and the version they were written with.
type writtenHours struct {
	version uint64
	hours   map[time.Time]bool
	rows    []rollupRow
}

// RefreshDays rebuilds the days of one organization in usage_rollup from usage_hourly
// FINAL, after the hours (refreshOrg). A day's version is the time just before it is
// read, so of two processes rebuilding one day the later read, which sees every hour
// written before it, wins; a crash between the hours and the days is found by
// StaleDays.
func (s *Store) RefreshDays(ctx context.Context, org string, days []time.Time) error {
	for _, sp := range rollups {
		if err := s.refreshDays(ctx, sp, org, slices.Clone(days), nil); err != nil {
			return err
		}
	}
	return nil
}

// refreshDays is RefreshDays, with the hours the caller has just written taken from
// written rather than read back: on a cluster usage_hourly is written without the
// insert quorum, so the replica a read goes to may not have them yet, and a day built
// from it would miss them for good (its version would be newer than theirs, so
// StaleDays would not list it). An hour read back with a newer version than written's
// (another process rebuilt it since) is taken as read.
//
// Each day is one insert into usage_rollup: its day rows and the hours they were built
// from wherever usage_rollup does not hold them yet (rollupDay). A day's rows are one
// partition, so the insert makes one part and a read sees the day with its hours or
// neither.
func (s *Store) refreshDays(ctx context.Context, sp *rollupSpec, org string, days []time.Time, written *writtenHours) error {
	slices.SortFunc(days, time.Time.Compare)
	days = slices.CompactFunc(days, time.Time.Equal)
	for _, day := range days {
		version := uint64(time.Now().UnixNano())
		hours, err := s.dayHours(ctx, sp, org, day)
		if err != nil {
			return err
		}
		hours = withWritten(day, hours, written)
		held, err := s.heldDay(ctx, sp, org, day)
		if err != nil {
			return err
		}
		if err := s.sendRollupRows(ctx, sp, org, rollupDay(day, version, hours, held)); err != nil {
			return err
		}
	}
	return nil
}

// DayKey names one day of one organization in the rollup.
type DayKey struct {
	OrgID string
	Day   time.Time
}

// StaleDays lists the days since since whose hours were rebuilt after the day was
// (a process stopped between the two writes).
func (s *Store) StaleDays(ctx context.Context, since time.Time) ([]DayKey, error) {
	stale := map[DayKey]bool{}
	for _, sp := range rollups {
		keys, err := s.staleDays(ctx, sp, since)
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			stale[k] = true
		}
	}
	out := make([]DayKey, 0, len(stale))
	for k := range stale {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b DayKey) int {
		if c := strings.Compare(a.OrgID, b.OrgID); c != 0 {
			return c
		}
		return a.Day.Compare(b.Day)
	})
	return out, nil
}

func (s *Store) staleDays(ctx context.Context, sp *rollupSpec, since time.Time) ([]DayKey, error) {
	latest := func(q string) (map[DayKey]uint64, error) {
		rows, err := s.conn.Query(ctx, q, since.UTC().Truncate(24*time.Hour))
		if err != nil {
			return nil, fmt.Errorf("cannot read the rollup versions of %s: %w", s.db, err)
		}
		defer rows.Close()
		out := map[DayKey]uint64{}
		for rows.Next() {
			var k DayKey
			var v uint64
			if err := rows.Scan(&k.OrgID, &k.Day, &v); err != nil {
				return nil, err
			}
			k.Day = k.Day.UTC()
			out[k] = v
		}
		return out, rows.Err()
	}
	hourly, err := latest("SELECT org_id, toStartOfDay(hour) AS d, max(version) FROM " + s.db + "." + sp.hourly + " WHERE hour >= ? GROUP BY org_id, d")
	if err != nil {
		return nil, err
	}
	// The day rows only: an hour row copied from usage_hourly carries the hour's
	// version, which says nothing of whether the day was rebuilt after it.
	daily, err := latest("SELECT org_id, bucket, max(version) FROM " + s.db + "." + sp.rollup + " WHERE grain = 'day' AND bucket >= ? GROUP BY org_id, bucket")
	if err != nil {
		return nil, err
	}
	var out []DayKey
	for k, v := range hourly {
		if v > daily[k] {
			out = append(out, k)
		}
	}
	return out, nil
}

// add sums o into r (the key and currency stay r's, or o's when r has none).
func (r *rollupRow) add(o *rollupRow) {
	r.events, r.unpriced, r.in, r.out, r.cr, r.cw, r.r = r.events+o.events, r.unpriced+o.unpriced, r.in+o.in, r.out+o.out, r.cr+o.cr, r.cw+o.cw, r.r+o.r
	r.uin, r.uout, r.ucr, r.ucw, r.ur = r.uin+o.uin, r.uout+o.uout, r.ucr+o.ucr, r.ucw+o.ucw, r.ur+o.ur
	r.cost = r.cost.Add(o.cost)
	if r.currency == "" && o.events > 0 {
		r.currency = o.currency
	}
}

// dayHours reads the hours of one day of org from usage_hourly FINAL, each row with its
// version.
func (s *Store) dayHours(ctx context.Context, sp *rollupSpec, org string, day time.Time) ([]rollupRow, error) {
	rows, err := s.conn.Query(ctx, `SELECT hour, `+sp.group+`, `+rollupSums+`
		FROM `+s.db+`.`+sp.hourly+` FINAL WHERE org_id = ? AND hour >= ? AND hour < ?`, org, day, day.Add(24*time.Hour))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.%s of org %q for %s: %w", s.db, sp.hourly, org, day.Format(time.DateOnly), err)
	}
	defer rows.Close()
	var out []rollupRow
	for rows.Next() {
		var r rollupRow
		dest := append(append([]any{&r.key.hour}, sp.dest(&r.key)...), &r.events, &r.unpriced, &r.in, &r.out,
			&r.cr, &r.cw, &r.r, &r.uin, &r.uout, &r.ucr, &r.ucw, &r.ur, &r.cost, &r.currency, &r.version)
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("cannot read %s.%s of org %q: %w", s.db, sp.hourly, org, err)
		}
		r.key.hour = r.key.hour.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}

// held is what usage_rollup holds of one day of one organization, each group's row of
// the highest version: the groups with events (of the day, and of each hour), and the
// highest version of each hour.
type held struct {
	day   map[rollupKey]bool // key.hour is the day
	hours map[rollupKey]bool
	hour  map[time.Time]uint64
}

// heldDay reads what usage_rollup holds of one day of org. The condition on events is
// applied to each group's newest row, after LIMIT 1 BY: before it, an older row of a
// group that was zeroed since would pass.
func (s *Store) heldDay(ctx context.Context, sp *rollupSpec, org string, day time.Time) (held, error) {
	h := held{day: map[rollupKey]bool{}, hours: map[rollupKey]bool{}, hour: map[time.Time]uint64{}}
	rows, err := s.conn.Query(ctx, `SELECT toString(grain), bucket, `+sp.group+`, events, version
		FROM `+s.db+`.`+sp.rollup+` WHERE org_id = ? AND bucket >= ? AND bucket < ?
		ORDER BY version DESC LIMIT 1 BY grain, bucket, `+sp.group, org, day, day.Add(24*time.Hour))
	if err != nil {
		return h, fmt.Errorf("cannot read %s.%s of org %q for %s: %w", s.db, sp.rollup, org, day.Format(time.DateOnly), err)
	}
	defer rows.Close()
	for rows.Next() {
		var grain string
		var k rollupKey
		var events, v uint64
		if err := rows.Scan(append(append([]any{&grain, &k.hour}, sp.dest(&k)...), &events, &v)...); err != nil {
			return h, fmt.Errorf("cannot read %s.%s of org %q: %w", s.db, sp.rollup, org, err)
		}
		k.hour = k.hour.UTC()
		switch grain {
		case grainDay:
			if events > 0 {
				h.day[k] = true
			}
		case grainHour:
			if events > 0 {
				h.hours[k] = true
			}
			h.hour[k.hour] = max(h.hour[k.hour], v)
		}
	}
	return h, rows.Err()
}

// The grains of usage_rollup.
const (
	grainHour = "hour"
	grainDay  = "day"
)

// rollupDay is what one insert into usage_rollup writes for day, from hours (the day's
// hour rows, each with its version) and what usage_rollup holds of the day:
//   - the day rows, at version: the hours summed per group, and zeros for every group
//     the day holds with events that the hours no longer have;
//   - every hour of hours newer than usage_rollup's copy of it (a rebuild it has not
//     seen: written by this process, or by one that stopped before its day), with
//     zeros at the hour's version for the groups the copy holds with events and the
//     hour no longer has. An hour usage_rollup holds at its version already is left
//     out, so a refresh writes only the hours rebuilt since.
func rollupDay(day time.Time, version uint64, hours []rollupRow, h held) []rollupRow {
	groups := map[rollupKey]*rollupRow{}
	var order []rollupKey
	newest := map[time.Time]uint64{}
	has := map[rollupKey]bool{}
	for _, r := range hours {
		newest[r.key.hour] = max(newest[r.key.hour], r.version)
		has[r.key] = true
		k := r.key
		k.hour = day
		if g := groups[k]; g != nil {
			g.add(&r)
			continue
		}
		g := r
		g.key, g.grain, g.version = k, grainDay, version
		if g.events == 0 {
			g.currency = "" // a zeroed group's row says nothing of the currency
		}
		groups[k] = &g
		order = append(order, k)
	}
	out := make([]rollupRow, 0, len(groups)+len(hours))
	for _, k := range order {
		out = append(out, *groups[k])
	}
	for _, k := range sortedKeys(h.day) {
		if groups[k] == nil {
			out = append(out, rollupRow{key: k, grain: grainDay, version: version, cost: decimal.Zero}) // gone from the day
		}
	}
	for _, r := range hours {
		if newest[r.key.hour] > h.hour[r.key.hour] {
			r.grain = grainHour
			out = append(out, r)
		}
	}
	for _, k := range sortedKeys(h.hours) {
		if v := newest[k.hour]; v > h.hour[k.hour] && !has[k] {
			out = append(out, rollupRow{key: k, grain: grainHour, version: v, cost: decimal.Zero}) // gone from the hour
		}
	}
	return out
}

// sortedKeys are the keys of m in a fixed order (an insert's rows come out the same
// from the same rollup).
func sortedKeys(m map[rollupKey]bool) []rollupKey {
	out := make([]rollupKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b rollupKey) int {
		return cmp.Or(a.hour.Compare(b.hour), strings.Compare(a.owner, b.owner), strings.Compare(a.agent, b.agent),
			strings.Compare(a.room, b.room), strings.Compare(a.model, b.model), strings.Compare(a.initiator, b.initiator),
			strings.Compare(a.initiatorType, b.initiatorType), strings.Compare(a.initiatorOwner, b.initiatorOwner), cmp.Compare(a.depth, b.depth))
	})
	return out
}

// withWritten replaces, in read (the hour rows of day read back), every hour written
// holds with written's rows of it, at written's version, unless a newer version of the
// hour was read (another process rebuilt it since).
func withWritten(day time.Time, read []rollupRow, written *writtenHours) []rollupRow {
	if written == nil {
		return read
	}
	newest := map[time.Time]uint64{}
	for _, r := range read {
		newest[r.key.hour] = max(newest[r.key.hour], r.version)
	}
	ours := func(h time.Time) bool { return written.hours[h] && newest[h] <= written.version }
	out := slices.DeleteFunc(read, func(r rollupRow) bool { return ours(r.key.hour) })
	for _, r := range written.rows {
		if r.key.hour.Truncate(24*time.Hour).Equal(day) && ours(r.key.hour) {
			r.version = written.version
			out = append(out, r)
		}
	}
	return out
}

// sendRollupRows writes rows (each with its grain and version) into sp's rollup table.
func (s *Store) sendRollupRows(ctx context.Context, sp *rollupSpec, org string, rows []rollupRow) error {
	return s.send(ctx, sp.rollup, sp.rollupCols(), len(rows), func(i int) uint32 { return MonthPartition(rows[i].key.hour) }, func(b driver.Batch, i int) error {
		r := &rows[i]
		return b.Append(append(append([]any{r.grain, r.key.hour, org}, sp.values(&r.key)...),
			r.events, r.unpriced, r.in, r.out, r.cr, r.cw, r.r, r.uin, r.uout, r.ucr, r.ucw, r.ur, r.cost, r.currency, r.version)...)
	})
}

// rebuildHours computes the rollup rows of the given hours of one organization, all
// in one day, from usage FINAL.
func (s *Store) rebuildHours(ctx context.Context, sp *rollupSpec, org string, hours []time.Time) ([]rollupRow, error) {
	want := map[time.Time]bool{}
	for _, h := range hours {
		want[h] = true
	}
	from, to := hours[0], hours[len(hours)-1].Add(time.Hour)
	rows, err := s.conn.Query(ctx, `SELECT toStartOfHour(time) AS h, `+sp.group+`,
		count(), countIf(priced = 0), sum(input_tokens), sum(output_tokens), sum(cache_read_tokens),
		sum(cache_write_tokens), sum(reasoning_tokens),
		sumIf(input_tokens, priced = 0), sumIf(output_tokens, priced = 0), sumIf(cache_read_tokens, priced = 0),
		sumIf(cache_write_tokens, priced = 0), sumIf(reasoning_tokens, priced = 0), sum(cost), any(currency)
		FROM `+s.db+`.usage FINAL
		WHERE org_id = ? AND time >= ? AND time < ?
		GROUP BY h, `+sp.group, org, from, to)
	if err != nil {
		return nil, fmt.Errorf("cannot aggregate %s.usage for org %q from %s: %w", s.db, org, from.Format(time.RFC3339), err)
	}
	var fresh []rollupRow
	seen := map[rollupKey]bool{}
	for rows.Next() {
		var r rollupRow
		if err := rows.Scan(append(append([]any{&r.key.hour}, sp.dest(&r.key)...),
			&r.events, &r.unpriced, &r.in, &r.out, &r.cr, &r.cw, &r.r, &r.uin, &r.uout, &r.ucr, &r.ucw, &r.ur, &r.cost, &r.currency)...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("cannot read usage aggregate for org %q: %w", org, err)
		}
		r.key.hour = r.key.hour.UTC()
		if want[r.key.hour] {
			fresh = append(fresh, r)
			seen[r.key] = true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Rows the rollup has now for those hours that the rebuild did not produce.
	old, err := s.conn.Query(ctx, `SELECT hour, `+sp.group+`
		FROM `+s.db+`.`+sp.hourly+` FINAL WHERE org_id = ? AND hour >= ? AND hour < ? AND events > 0`, org, from, to)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.%s for org %q: %w", s.db, sp.hourly, org, err)
	}
	for old.Next() {
		var k rollupKey
		if err := old.Scan(append([]any{&k.hour}, sp.dest(&k)...)...); err != nil {
			old.Close()
			return nil, err
		}
		k.hour = k.hour.UTC()
		if want[k.hour] && !seen[k] {
			fresh = append(fresh, rollupRow{key: k, cost: decimal.Zero})
		}
	}
	old.Close()
	return fresh, old.Err()
}

func (s *Store) sendRollup(ctx context.Context, sp *rollupSpec, org string, rows []rollupRow, version uint64) error {
	return s.send(ctx, sp.hourly, sp.hourlyCols(), len(rows), func(i int) uint32 { return MonthPartition(rows[i].key.hour) }, func(b driver.Batch, i int) error {
		r := &rows[i]
		return b.Append(append(append([]any{r.key.hour, org}, sp.values(&r.key)...),
			r.events, r.unpriced, r.in, r.out, r.cr, r.cw, r.r, r.uin, r.uout, r.ucr, r.ucw, r.ur, r.cost, r.currency, version)...)
	})
}

// StaleHours lists the hours holding usage written after the rollup's last rebuild,
// less margin (a batch can be written while a rebuild runs). After a crash these are
// the hours the lost process had not rebuilt yet. With an empty rollup it lists every
// hour that has usage.
func (s *Store) StaleHours(ctx context.Context, margin time.Duration) ([]HourKey, error) {
	var last uint64
	// The older of the rollups' last rebuilds: one that is empty (a new one, say)
	// lists every hour, and the catch-up fills it.
	for i, sp := range rollups {
		var v uint64
		if err := s.conn.QueryRow(ctx, "SELECT max(version) FROM "+s.db+"."+sp.hourly).Scan(&v); err != nil {
			return nil, fmt.Errorf("cannot read the last rollup rebuild of %s.%s: %w", s.db, sp.hourly, err)
		}
		if i == 0 || v < last {
			last = v
		}
	}
	since := uint64(0)
	if m := uint64(margin.Nanoseconds()); last > m {
		since = last - m
	}
	rows, err := s.conn.Query(ctx, "SELECT DISTINCT org_id, toStartOfHour(time) FROM "+s.db+".usage WHERE version > ?", since)
	if err != nil {
		return nil, fmt.Errorf("cannot list stale rollup hours of %s: %w", s.db, err)
	}
	defer rows.Close()
	var out []HourKey
	for rows.Next() {
		var k HourKey
		if err := rows.Scan(&k.OrgID, &k.Hour); err != nil {
			return nil, err
		}
		k.Hour = k.Hour.UTC()
		out = append(out, k)
	}
	return out, rows.Err()
}
