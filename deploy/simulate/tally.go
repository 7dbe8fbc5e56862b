package simulate

import (
	"fmt"

	"github.com/bandplane/bandplane/schema/cause"
	"github.com/bandplane/bandplane/schema/store"
)

// Chain is the stored link (store.Chain) that the truth says the event must have:
// its initiator, trigger, depth and kind of link (the trigger's event id and the
// initiator's organization and owner are not part of the truth).
func (t Truth) Chain() store.Chain {
	c := store.Chain{InitiatorID: t.Initiator.ID, InitiatorType: string(t.Initiator.Type), Depth: uint16(t.Depth),
		TriggerID: t.TriggerMessageID, Link: cause.SourceInferred}
	if t.Explicit {
		c.Link = cause.SourceExplicit
	}
	return c
}

// Agrees says whether stored link c is the one the truth says.
func (t Truth) Agrees(c store.Chain) bool {
	return t.Chain() == store.Chain{InitiatorID: c.InitiatorID, InitiatorType: c.InitiatorType, Depth: c.Depth, TriggerID: c.TriggerID, Link: c.Link}
}

// Score counts links that agree with the truth.
type Score struct{ N, OK int }

// Add counts one link.
func (s *Score) Add(ok bool) {
	s.N++
	if ok {
		s.OK++
	}
}

// Share is the part of the links that agree (1 when there are none).
func (s Score) Share() float64 {
	if s.N == 0 {
		return 1
	}
	return float64(s.OK) / float64(s.N)
}

func (s Score) String() string { return fmt.Sprintf("%d of %d (%.3f %%)", s.OK, s.N, 100*s.Share()) }

// Tally is how the usage events' stored links of a run compare with its truth: the
// explicit ones (the late among them, once their trigger came) and the inferred ones,
// and the wrong links that the truth does not call ambiguous.
type Tally struct {
	Explicit, Late, Inferred Score
	Unexplained              []string
}

// Add counts usage event tr.EventID's stored link c.
func (t *Tally) Add(tr Truth, c store.Chain) {
	ok := tr.Agrees(c)
	switch {
	case tr.Late:
		t.Late.Add(ok)
		t.Explicit.Add(ok)
	case tr.Explicit:
		t.Explicit.Add(ok)
	default:
		t.Inferred.Add(ok)
	}
	if !ok && !tr.Ambiguous {
		t.Unexplained = append(t.Unexplained, fmt.Sprintf("%s: want %+v, got %+v (truth %+v)", tr.EventID, tr.Chain(), c, tr))
	}
}
