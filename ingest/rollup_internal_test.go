package ingest

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/store"
)

func TestRegisteredModelIsTheAgentsOfTheRowsOrganization(t *testing.T) {
	dir := directory.New()
	dir.Load([]store.DirectoryRow{
		{Kind: "agent", ID: "a1", OrgID: "org-a", Model: "gpt-5-mini", Version: 1},
		{Kind: "agent", ID: "a2", OrgID: "org-a", Version: 1}, // registered without a model
	})
	for _, tc := range []struct {
		name, org, agent, model string
		want                    string // "": the row keeps its model
	}{
		{"its organization's usage", "org-a", "a1", Unknown, "gpt-5-mini"},
		{"usage stored before any registration", "", "a1", Unknown, "gpt-5-mini"},
		{"a model left empty", "org-a", "a1", "", "gpt-5-mini"},
		{"another organization's usage of the same id", "org-b", "a1", Unknown, ""},
		{"another organization's usage with no model named", "org-b", "a1", "", ""},
		{"an agent the directory does not know", "org-a", "a9", Unknown, ""},
		{"an agent registered without a model", "org-a", "a2", Unknown, ""},
		{"usage that names its model", "org-a", "a1", "claude-opus-4-6", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := registeredModel(dir, store.UsageRow{OrgID: tc.org, AgentID: tc.agent, Model: tc.model})
			assert.Equal(t, tc.want != "", ok)
			assert.Equal(t, tc.want, got)
		})
	}
}
