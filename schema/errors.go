package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// FieldError is why an event (or a line that should hold one) is invalid: the field,
// as a dotted path into the canonical envelope or the platform frame ("time",
// "actor.id", "data.input_tokens", "payload.inserted_at", "topic"), and the reason.
// Problems with the line as a whole (malformed JSON, not an object) have no field.
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
