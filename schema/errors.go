package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// The kinds of error every surface tells apart with errors.Is and maps the same way
// (GraphQL codes, HTTP statuses, exit codes). Each is wrapped with a message saying
// what was refused and why; a FieldError is ErrInvalid.
var (
	// ErrInvalid: the caller's input is wrong; the message is safe to show as is.
	ErrInvalid = errors.New("invalid input")
	// ErrUnauthenticated: no key, or one that does not exist or is revoked.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrForbidden: the key may not do this (its role, or another organization).
	ErrForbidden = errors.New("forbidden")
	// ErrNotFound: nothing of that name visible to the caller (another organization's
	// is reported the same way).
	ErrNotFound = errors.New("not found")
	// ErrConflict: the state forbids it now (an unfinished job exists, a job is
	// finished already).
	ErrConflict = errors.New("conflict")
	// ErrTooMany: the caller holds as many of a shared resource as it may at once.
	ErrTooMany = errors.New("too many requests")
	// ErrUnavailable: a dependency cannot serve it now; retrying may work.
	ErrUnavailable = errors.New("unavailable")
)

// FieldError is a problem with one field of an input, the caller's mistake, safe to
// show as is: of an event (or a line that should hold one), the field is a dotted path
// into the canonical envelope or the platform frame ("time", "actor.id",
// "data.input_tokens", "payload.inserted_at", "topic"); of an API call, the argument
// ("limit", "budget.cost"). Problems with the input as a whole (malformed JSON, not an
// object) have no field. It is ErrInvalid (errors.Is).
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// Is makes every FieldError ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

func fieldErr(field, format string, args ...any) *FieldError {
	if len(args) == 0 {
		return &FieldError{Field: field, Reason: format}
	}
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// jsonErr turns an encoding/json error into a FieldError. prefix is prepended to the
// path of a type mismatch ("data." when the error comes from decoding the data object).
func jsonErr(err error, prefix string) *FieldError {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return &FieldError{Reason: fmt.Sprintf("invalid JSON at offset %d: %s", se.Offset, se.Error())}
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" && prefix == "" {
			return &FieldError{Reason: fmt.Sprintf("expected a JSON object, got %s", te.Value)}
		}
		field = strings.TrimSuffix(prefix+field, ".")
		return &FieldError{Field: field, Reason: fmt.Sprintf("expected %s, got %s", jsonKind(te.Type.Kind().String()), te.Value)}
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe
	}
	return &FieldError{Field: strings.TrimSuffix(prefix, "."), Reason: err.Error()}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "integer"
	case "float32", "float64":
		return "number"
	case "bool":
		return "boolean"
	case "slice", "array":
		return "array"
	case "struct", "map", "ptr":
		return "object"
	}
	return goKind
}
