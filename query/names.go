package query

import (
	"context"
	"fmt"
	"slices"

	"github.com/ClickHouse/clickhouse-go/v2/ext"

	"github.com/bandplane/bandplane/schema/chdb"
)

// MaxNames bounds the ids one Names call looks up (a costs page has at most
// DefaultCostLimit rows, each with an owner and an agent).
const MaxNames = 2 * DefaultCostLimit

// Party is what people read for an agent's or a person's id: the @handle and the
// display name from the directory.
type Party struct {
	Kind   string // "agent" or "user"
	Handle string
	Name   string
}

// Names looks up, in the directory of orgID only, the agents and people with the given
// ids (duplicates and "" ignored). An id not in that organization's directory (unknown,
// or another organization's) has no entry: it is never named across organizations.
func (qr *Querier) Names(ctx context.Context, orgID string, ids []string) (map[string]Party, error) {
	if orgID == "" {
		return nil, fieldErr("org_id", "required")
	}
	uniq := uniqueIDs(ids)
	if len(uniq) == 0 {
		return map[string]Party{}, nil
	}
	if len(uniq) > MaxNames {
		return nil, fieldErr("ids", "%d ids to name; at most %d at once", len(uniq), MaxNames)
	}
	// The ids travel as an external table, so the query text does not grow with them
	// (ids of up to 256 bytes would pass max_query_size).
	ictx, err := withIDs(ctx, uniq)
	if err != nil {
		return nil, fmt.Errorf("cannot build the id table for a names lookup in %s.directory: %w", qr.db, err)
	}
	rows, err := qr.conn.Query(ictx,
		"SELECT toString(kind), id, handle, name FROM "+qr.db+".directory FINAL WHERE org_id = ? AND id IN (SELECT id FROM "+idsTable+")", orgID)
	if err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot look up names of org %q in %s.directory", orgID, qr.db))
	}
	defer rows.Close()
	out := make(map[string]Party, len(uniq))
	for rows.Next() {
		var id string
		var p Party
		if err := rows.Scan(&p.Kind, &id, &p.Handle, &p.Name); err != nil {
			return nil, fmt.Errorf("cannot read names of org %q from %s.directory: %w", orgID, qr.db, err)
		}
		out[id] = p
	}
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read names of org %q from %s.directory", orgID, qr.db))
	}
	return out, nil
}

// idsTable is the external table withIDs sends: one String column, id.
const idsTable = "_bandplane_ids"

// withIDs returns ctx carrying ids as the external table idsTable, for queries that
// filter by a set of ids (`x IN (SELECT id FROM _bandplane_ids)`): the query text stays
// small whatever the ids, and 18.16 cannot bind an array to IN.
func withIDs(ctx context.Context, ids []string) (context.Context, error) {
	tbl, err := ext.NewTable(idsTable, ext.Column("id", "String"))
	if err == nil {
		_, err = tbl.Block().Columns[0].Append(ids)
	}
	if err != nil {
		return nil, err
	}
	return chdb.WithExternalTable(ctx, tbl), nil
}

// uniqueIDs returns ids sorted, without duplicates and "".
func uniqueIDs(ids []string) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if id != "" {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
