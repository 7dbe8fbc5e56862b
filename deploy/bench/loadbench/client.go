package loadbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"

	"github.com/bandplane/bandplane/policy"
)

const (
	costsQuery = `query($from: Time!, $to: Time!) {
  costs(from: $from, to: $to, groupBy: [AGENT, MODEL]) {
    rows { agentId agentHandle agentName model cost currency tokens { total } }
    totals { cost currency }
  }
}`
	auditQuery = `query {
  auditEvents(types: ["message.created"], limit: 100) {
    events { id type time actorId actorName roomName data }
    nextCursor
  }
}`
	// hostileAuditQuery reads org-h's newest messages, their content included: the
	// large events.
	hostileAuditQuery = `query($limit: Int) {
  auditEvents(types: ["message.created"], limit: $limit) { events { id data } }
}`
	workSubscription = `subscription { workStatusChanged { kind eventId task { id title } } }`
)

type costsData struct {
	Costs struct {
		Rows []struct {
			AgentID string `json:"agentId"`
		} `json:"rows"`
	} `json:"costs"`
}

type auditData struct {
	AuditEvents struct {
		Events []struct {
			ID string `json:"id"`
		} `json:"events"`
	} `json:"auditEvents"`
}

// refusal is a request the server did not answer as asked: reason is its class (the
// status, the GraphQL error code, "timeout", "transport"), detail the error.
type refusal struct {
	reason, detail string
}

func (r *refusal) Error() string { return r.reason + ": " + r.detail }

// asRefusal classifies any error of a request.
func asRefusal(err error) *refusal {
	var r *refusal
	if errors.As(err, &r) {
		return r
	}
	return transportRefusal(err)
}

func transportRefusal(err error) *refusal {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return &refusal{reason: "timeout", detail: err.Error()}
	}
	return &refusal{reason: "transport", detail: err.Error()}
}

// graphQLAnswer is a GraphQL response.
type graphQLAnswer struct {
	Data   json.RawMessage `json:"data"`
	Errors []struct {
		Message    string `json:"message"`
		Extensions struct {
			Code string `json:"code"`
		} `json:"extensions"`
	} `json:"errors"`
}

// postGraphQL posts one query with token and decodes its data into out; an error
// status, a GraphQL error or no data is a refusal.
func postGraphQL(ctx context.Context, c *http.Client, url, token, query string, vars map[string]any, out any) error {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return err
	}
	raw, err := post(ctx, c, url+"/graphql", token, body)
	if err != nil {
		return err
	}
	var a graphQLAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		return &refusal{reason: "bad answer", detail: fmt.Sprintf("%v: %.300s", err, raw)}
	}
	if len(a.Errors) > 0 {
		code := a.Errors[0].Extensions.Code
		if code == "" {
			code = "GraphQL error"
		}
		return &refusal{reason: code, detail: a.Errors[0].Message}
	}
	if len(a.Data) == 0 || string(a.Data) == "null" {
		return &refusal{reason: "bad answer", detail: fmt.Sprintf("no data: %.300s", raw)}
	}
	return json.Unmarshal(a.Data, out)
}

// postDecision asks peer_visible; anything but 200 is a refusal.
func postDecision(ctx context.Context, c *http.Client, url, token string, body []byte) error {
	_, err := post(ctx, c, url+"/v1/decisions/"+policy.PeerVisible, token, body)
	return err
}

// post sends a JSON body with token and returns the answer's body; a failed request or
// anything but 200 is a refusal.
func post(ctx context.Context, c *http.Client, url, token string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return nil, transportRefusal(err)
	}
	defer resp.Body.Close() //nolint:errcheck // read to the end below
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, transportRefusal(err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &refusal{reason: "HTTP " + strconv.Itoa(resp.StatusCode), detail: fmt.Sprintf("%s: %.300s", resp.Status, raw)}
	}
	return raw, nil
}
