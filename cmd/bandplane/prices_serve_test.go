package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/query"
)

// The price service's errors reach GraphQL with its codes: field errors (each one) and
// conflicts as the caller's mistakes, forbidden as forbidden, the message kept.
func TestGraphErrMapping(t *testing.T) {
	var _ graph.Prices = priceGraph{}

	err := graphErr(errors.Join(&prices.FieldError{Field: "input", Msg: `"-1" is negative`}, &prices.FieldError{Field: "model", Msg: "required"}), "model")
	assert.True(t, query.IsInvalid(err))
	assert.ErrorContains(t, err, `input: "-1" is negative`)
	assert.ErrorContains(t, err, "model: required")

	forbidden := fmt.Errorf("%w: prices are platform-wide", prices.ErrForbidden)
	err = graphErr(forbidden, "model")
	assert.ErrorIs(t, err, graph.ErrForbidden)
	assert.ErrorIs(t, err, prices.ErrForbidden)
	assert.Equal(t, forbidden.Error(), err.Error())
	assert.False(t, query.IsInvalid(err))

	conflict := fmt.Errorf("%w: reprice job j1 of organization %q is running", prices.ErrConflict, "acme")
	err = graphErr(conflict, "orgId")
	var fe *query.FieldError
	if assert.ErrorAs(t, err, &fe) {
		assert.Equal(t, "orgId", fe.Field)
		assert.Contains(t, fe.Msg, "j1")
	}
	other := errors.New("cannot read x.prices: connection refused")
	assert.Same(t, other, graphErr(other, "model"), "anything else as it is: an internal error")
}
