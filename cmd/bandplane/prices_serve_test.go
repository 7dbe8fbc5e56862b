package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/schema"
)

// The price service's errors reach GraphQL as they are (field errors, each one, are
// invalid input; forbidden is forbidden), and a conflict becomes the caller's mistake
// about the field named.
func TestGraphErrMapping(t *testing.T) {
	var _ graph.Prices = priceGraph{}

	err := graphErr(errors.Join(&schema.FieldError{Field: "input", Reason: `"-1" is negative`}, &schema.FieldError{Field: "model", Reason: "required"}), "model")
	assert.True(t, errors.Is(err, schema.ErrInvalid))
	assert.ErrorContains(t, err, `input: "-1" is negative`)
	assert.ErrorContains(t, err, "model: required")

	forbidden := fmt.Errorf("%w: prices are platform-wide", schema.ErrForbidden)
	err = graphErr(forbidden, "model")
	assert.ErrorIs(t, err, schema.ErrForbidden)
	assert.Equal(t, forbidden.Error(), err.Error())
	assert.False(t, errors.Is(err, schema.ErrInvalid))

	conflict := fmt.Errorf("%w: reprice job j1 of organization %q is running", schema.ErrConflict, "acme")
	err = graphErr(conflict, "orgId")
	var fe *schema.FieldError
	if assert.ErrorAs(t, err, &fe) {
		assert.Equal(t, "orgId", fe.Field)
		assert.Contains(t, fe.Reason, "j1")
	}
	other := errors.New("cannot read x.prices: connection refused")
	assert.Same(t, other, graphErr(other, "model"), "anything else as it is: an internal error")
}
