package graph

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema/work/worktest"
)

// caseHandles is the cases' directory as the hub reads it.
type caseHandles struct{}

func (caseHandles) Handle(_, id string) (string, bool, bool) {
	for _, p := range worktest.Directory {
		if p.ID == id {
			return p.Handle, p.Person, true
		}
	}
	return "", false, false
}

// TestHubWorkCases runs the shared work-status cases through the live hub: each event
// is published at its own time, then the hub looks for stuck tasks at the case's Now.
// query's TestIntegrationWorkCases runs the same cases through the SQL.
func TestHubWorkCases(t *testing.T) {
	for _, c := range worktest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			var now time.Time
			h := NewHub(HubConfig{StuckAfter: worktest.StuckAfter, Handles: caseHandles{}, Now: func() time.Time { return now }})
			for _, e := range c.Events {
				now = worktest.Start.Add(e.At)
				h.Publish(e.Canonical("org-a"))
			}
			now = worktest.Start.Add(c.Now)
			h.checkStuck()

			got := worktest.Want{}
			h.mu.Lock()
			defer h.mu.Unlock()
			o := h.org("org-a")
			for id, tr := range o.tasks {
				if got.InProgress == nil {
					got.InProgress = map[string]bool{}
				}
				got.InProgress[id] = tr.task.Stuck
			}
			for _, list := range o.attention {
				for _, a := range list {
					if got.Open == nil {
						got.Open = map[string]string{}
					}
					got.Open[a.ID] = a.AddressedTo
				}
			}
			require.Equal(t, c.Want, got)
		})
	}
}
