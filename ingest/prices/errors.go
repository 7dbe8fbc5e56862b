package prices

import (
	"fmt"

	"github.com/bandplane/bandplane/schema"
)

// fieldErr is the caller's mistake in one field of an input (schema.ErrInvalid).
func fieldErr(field, format string, args ...any) error {
	return &schema.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
