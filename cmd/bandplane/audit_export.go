package main

import (
	"log/slog"
	"net/http"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/policy/keys"
)

// auditExportHandler serves GET /v1/audit/export (issue 9, section 4).
func auditExportHandler(conn driver.Conn, db string, auth keys.Authenticator, auditKeyFile string, log *slog.Logger) (http.Handler, error) {
	return http.NotFoundHandler(), nil
}
