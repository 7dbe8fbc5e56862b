package prices

import (
	"errors"
	"fmt"
)

// Errors the API returns, to be told apart with errors.Is (the GraphQL layer maps them
// to its codes). Each is wrapped with a message saying what was refused and why.
var (
	// ErrForbidden: the key may not do this (prices are changed by platform admins only).
	ErrForbidden = errors.New("forbidden")
	// ErrNotFound: no such job visible to the caller (another organization's job is
	// reported the same way).
	ErrNotFound = errors.New("not found")
	// ErrConflict: the state forbids it now (an unfinished reprice job of the
	// organization exists; the job is already finished).
	ErrConflict = errors.New("conflict")
)

// FieldError is a problem with one field of an input: the caller's mistake, safe to
// show as is.
type FieldError struct {
	Field string // e.g. "input", "effective"
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// IsInvalid reports whether err (or any error joined in it) is a FieldError.
func IsInvalid(err error) bool {
	var fe *FieldError
	return errors.As(err, &fe)
}
