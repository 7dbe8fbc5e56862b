package graph

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/99designs/gqlgen/graphql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// appendResponse must say what json.Marshal of the response says: the same members
// with the same values, whatever the data holds.
func TestAppendResponseEqualsMarshal(t *testing.T) {
	yes := true
	for name, resp := range map[string]*graphql.Response{
		"data only":    {Data: json.RawMessage(`{"a":{"b":[1,2,"<&>\u2028"]}}`)},
		"no data":      {Errors: gqlerror.List{{Message: "bad"}}},
		"null data":    {Data: json.RawMessage(`null`), Errors: gqlerror.List{{Message: "x", Path: ast.Path{ast.PathName("a"), ast.PathIndex(3)}}}},
		"spaced data":  {Data: json.RawMessage(" {\"a\":1} \n")},
		"every field":  {Data: json.RawMessage(`{}`), Label: "l", Path: ast.Path{ast.PathName("p")}, HasNext: &yes, Extensions: map[string]any{"k": 1}},
		"empty":        {},
		"quoted error": {Errors: gqlerror.List{{Message: "\"quote\" \\ \n newline", Extensions: map[string]any{"code": "BAD_USER_INPUT"}}}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := appendResponse([]byte("prefix:"), resp)
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(string(got), "prefix:"), "appends to dst")
			got = got[len("prefix:"):]
			require.True(t, json.Valid(got), "valid JSON: %s", got)
			want, err := json.Marshal(resp)
			require.NoError(t, err)
			var g, w any
			require.NoError(t, json.Unmarshal(got, &g))
			require.NoError(t, json.Unmarshal(want, &w))
			assert.Equal(t, w, g)
		})
	}
	// Errors come before data.
	b, err := appendResponse(nil, &graphql.Response{Data: json.RawMessage(`{"a":1}`), Errors: gqlerror.List{{Message: "m"}}})
	require.NoError(t, err)
	assert.Equal(t, `{"errors":[{"message":"m"}],"data":{"a":1}}`, string(b))
}

func TestResponseMedia(t *testing.T) {
	for accept, want := range map[string]string{
		"":                                  mediaJSON,
		"application/json":                  mediaJSON,
		"*/*":                               mediaJSON,
		"application/graphql-response+json": mediaGraphQLResponse,
		"application/graphql-response+json;q=0.9, application/json": mediaGraphQLResponse,
		"text/html, application/json":                               mediaJSON,
		"text/html":                                                 mediaJSON,
		";;;, \x00":                                                 mediaJSON,
	} {
		assert.Equal(t, want, responseMedia(accept), "Accept %q", accept)
	}
}
