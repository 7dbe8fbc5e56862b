package store

import (
	"context"
	"errors"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// ValueError is a value the client cannot encode for its column (clickhouse-go refused
// to append it, before anything was sent): the rows holding it can never be written
// as they are.
type ValueError struct {
	Table string // db.table
	Err   error
}

// Error is the client's message alone: the store's errors wrapping it name the table.
func (e *ValueError) Error() string { return e.Err.Error() }

func (e *ValueError) Unwrap() error { return e.Err }

// ClickHouse exception codes (src/Common/ErrorCodes.cpp) that mean the data itself is
// refused: the same rows fail the same way on every attempt, so retrying them stalls
// ingest forever. Ingest isolates the rows that cause them and dead-letters those.
var dataErrorCodes = map[int32]string{
	6:   "CANNOT_PARSE_TEXT",
	25:  "CANNOT_PARSE_ESCAPE_SEQUENCE",
	26:  "CANNOT_PARSE_QUOTED_STRING",
	27:  "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
	38:  "CANNOT_PARSE_DATE",
	41:  "CANNOT_PARSE_DATETIME",
	53:  "TYPE_MISMATCH",
	69:  "ARGUMENT_OUT_OF_BOUND",
	70:  "CANNOT_CONVERT_TYPE",
	72:  "CANNOT_PARSE_NUMBER",
	117: "INCORRECT_DATA",
	128: "TOO_LARGE_ARRAY_SIZE",
	131: "TOO_LARGE_STRING_SIZE",
	153: "ILLEGAL_DIVISION",
	190: "SIZES_OF_ARRAYS_DOESNT_MATCH",
	321: "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
	349: "CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN",
	376: "CANNOT_PARSE_UUID",
	395: "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO", // a constraint written as a MATERIALIZED throwIf(…) column
	407: "DECIMAL_OVERFLOW",
	441: "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
}

// tooManyParts is TOO_MANY_PARTS. The server uses it for two different things: "Too
// many parts … Merges are processing significantly slower than inserts" (back off and
// retry) and, on releases ≥ 19.x, "Too many partitions for single INSERT block (more
// than max_partitions_per_insert_block)", which no retry of the same block can pass.
const tooManyParts = 252

// memoryLimitExceeded is MEMORY_LIMIT_EXCEEDED: the server (or the query) ran out of
// the memory it may use. A smaller insert may pass where the same one fails again.
const memoryLimitExceeded = 241

// MemoryLimit reports whether err is ClickHouse's MEMORY_LIMIT_EXCEEDED (241). It is not
// Permanent: the rows are not refused, they were too many at once (or the server was
// busy with other queries). Ingest splits a batch of several records that gets it, and
// retries a single record with back-off.
func MemoryLimit(err error) bool {
	if err == nil {
		return false
	}
	var ex *clickhouse.Exception
	return errors.As(err, &ex) && ex.Code == memoryLimitExceeded
}

// Permanent reports whether err means that the rows written can never be accepted as
// they are: a ClickHouse exception about the data (dataErrorCodes, or too many
// partitions in one block) or a value the client cannot encode (ValueError).
//
// Everything else is transient and retried: network errors and timeouts, context
// errors, a server that is overloaded, read-only, out of memory or without Keeper
// (TIMEOUT_EXCEEDED 159, READONLY 164, TOO_MANY_SIMULTANEOUS_QUERIES 202,
// SOCKET_TIMEOUT 209, NETWORK_ERROR 210, MEMORY_LIMIT_EXCEEDED 241 (see MemoryLimit),
// TABLE_IS_READ_ONLY 242, "Too many parts" 252, UNKNOWN_STATUS_OF_INSERT 319,
// KEEPER_EXCEPTION 999 and the other Keeper codes), and on purpose the schema problems
// (UNKNOWN_TABLE 60, UNKNOWN_DATABASE 81, NO_SUCH_COLUMN_IN_TABLE 16,
// UNKNOWN_IDENTIFIER 47): those are an operator's to fix (`bandplane migrate`), and
// dead-lettering the stream meanwhile would empty it into the dead-letter table. An
// exception code not named here is treated as transient too: a stall that the logs
// name (with the code) is recoverable, a good record dead-lettered needs a replay.
func Permanent(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ve *ValueError
	if errors.As(err, &ve) {
		return true
	}
	var ex *clickhouse.Exception
	if !errors.As(err, &ex) {
		return false
	}
	if ex.Code == tooManyParts {
		return strings.Contains(ex.Message, "Too many partitions")
	}
	_, ok := dataErrorCodes[ex.Code]
	return ok
}
