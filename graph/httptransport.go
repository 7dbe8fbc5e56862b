package graph

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/errcode"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// httpTransport serves GraphQL over HTTP: GET (queries only) and POST with a JSON
// body, as gqlgen's GET and POST transports do, but writes each response with
// appendResponse. gqlgen's transports json.Marshal the response, and encoding/json
// validates and compacts the json.RawMessage of its data, a second walk over bytes
// the size of the page, that is most of a large page's CPU in the process and lands
// on the tenants that share the cores with it.
type httpTransport struct{}

var _ graphql.Transport = httpTransport{}

const (
	mediaJSON            = "application/json"
	mediaGraphQLResponse = "application/graphql-response+json"
)

func (httpTransport) Supports(r *http.Request) bool {
	if r.Header.Get("Upgrade") != "" {
		return false
	}
	switch r.Method {
	case http.MethodGet:
		return true
	case http.MethodPost:
		media, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		return err == nil && media == mediaJSON
	}
	return false
}

func (httpTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	ctx := r.Context()
	media := responseMedia(r.Header.Get("Accept"))
	w.Header().Set("Content-Type", media)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	params, err := requestParams(r)
	if err != nil {
		writeResponse(w, http.StatusBadRequest, &graphql.Response{Errors: gqlerror.List{{Message: err.Error()}}})
		return
	}
	params.Headers = r.Header
	rc, errs := exec.CreateOperationContext(ctx, params)
	if errs != nil {
		status := http.StatusOK
		if errcode.GetErrorKind(errs) == errcode.KindProtocol {
			status = http.StatusUnprocessableEntity
			if media == mediaGraphQLResponse {
				status = http.StatusBadRequest
			}
		}
		writeResponse(w, status, exec.DispatchError(graphql.WithOperationContext(ctx, rc), errs))
		return
	}
	if op := rc.Doc.Operations.ForName(rc.OperationName); r.Method == http.MethodGet && op != nil && op.Operation != ast.Query {
		writeResponse(w, http.StatusMethodNotAllowed, &graphql.Response{Errors: gqlerror.List{{
			Message: fmt.Sprintf("a GET request may run a query only, not a %s: send it as POST", op.Operation)}}})
		return
	}
	responses, ctx := exec.DispatchOperation(ctx, rc)
	writeResponse(w, http.StatusOK, responses(ctx))
}

// requestParams reads the operation of a GET's query string or a POST's JSON body
// (graph.limit has bounded and buffered the body).
func requestParams(r *http.Request) (*graphql.RawParams, error) {
	p := &graphql.RawParams{ReadTime: graphql.TraceTiming{Start: graphql.Now()}}
	if r.Method == http.MethodGet {
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			return nil, fmt.Errorf("the query string is malformed: %w", err)
		}
		p.Query, p.OperationName = q.Get("query"), q.Get("operationName")
		for name, into := range map[string]*map[string]any{"variables": &p.Variables, "extensions": &p.Extensions} {
			if v := q.Get(name); v != "" {
				if err := decodeJSON(strings.NewReader(v), into); err != nil {
					return nil, fmt.Errorf("the query string's %s are not a JSON object: %w", name, err)
				}
			}
		}
	} else if err := decodeJSON(r.Body, p); err != nil {
		return nil, fmt.Errorf("the request body is not a JSON object of query, variables, operationName and extensions: %w", err)
	}
	p.ReadTime.End = graphql.Now()
	return p, nil
}

func decodeJSON(r interface{ Read([]byte) (int, error) }, into any) error {
	dec := json.NewDecoder(r)
	dec.UseNumber() // variables keep their numbers exact, as gqlgen's transports do
	if err := dec.Decode(into); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

// responseMedia is the media type the client's Accept prefers of the two GraphQL over
// HTTP answers with; application/json when it names neither.
func responseMedia(accept string) string {
	for part := range strings.SplitSeq(accept, ",") {
		media, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch media {
		case mediaGraphQLResponse:
			return mediaGraphQLResponse
		case mediaJSON, "application/*", "*/*":
			return mediaJSON
		}
	}
	return mediaJSON
}

func writeResponse(w http.ResponseWriter, status int, resp *graphql.Response) {
	b, err := appendResponse(nil, resp)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = appendResponse(nil, &graphql.Response{Errors: gqlerror.List{{Message: "cannot encode the response: " + err.Error()}}})
	}
	w.WriteHeader(status)
	_, _ = w.Write(b) // the client went away: nothing left to tell it
}

// responseHead is a graphql.Response but its data, in the same JSON names.
type responseHead struct {
	Errors     gqlerror.List  `json:"errors,omitempty"`
	Label      string         `json:"label,omitempty"`
	Path       ast.Path       `json:"path,omitempty"`
	HasNext    *bool          `json:"hasNext,omitempty"`
	Extensions map[string]any `json:"extensions,omitempty"`
}

// appendResponse appends the JSON of resp to dst: every field but data through
// encoding/json, and data, which gqlgen's executor writes as valid, compact JSON,
// as it is. Errors come first, as the GraphQL specification suggests.
func appendResponse(dst []byte, resp *graphql.Response) ([]byte, error) {
	head, err := json.Marshal(responseHead{Errors: resp.Errors, Label: resp.Label, Path: resp.Path, HasNext: resp.HasNext, Extensions: resp.Extensions})
	if err != nil {
		return dst, err
	}
	dst = append(dst, head[:len(head)-1]...)
	if len(head) > 2 {
		dst = append(dst, ',')
	}
	dst = append(dst, `"data":`...)
	if data := bytes.TrimSpace(resp.Data); len(data) > 0 {
		dst = append(dst, data...)
	} else {
		dst = append(dst, "null"...)
	}
	return append(dst, '}'), nil
}
