package trail

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// ExportScanner follows an export's bytes as they are written or read back: where
// each record ends, its kind, how many events came, the header, the last event and
// the last record. It checks nothing (VerifyExport does); it is what a client needs to
// show progress and to resume a file cut anywhere, a record at a time: a record counts
// once its newline is there (in CSV, a newline outside quotes).
type ExportScanner struct {
	encoding string
	off      int64
	inQuote  bool // CSV: inside a quoted field
	cur      []byte
	last     []byte
	over     bool // the current record is longer than MaxExportLineBytes

	Events       uint64 // event records
	Gaps         uint64 // gap records
	Header       []byte // the header record (newline included)
	HeaderEnd    int64  // the offset after it
	LastEvent    []byte // the last event record
	LastEventEnd int64  // the offset after it
	LastKind     string // the kind of the last record
	LastEnd      int64  // the offset after the last complete record
	Error        []byte // the first error record, if the server sent one
	ErrorStart   int64  // where it starts
	Manifest     []byte // the last manifest record
}

// NewExportScanner scans an export of the given encoding.
func NewExportScanner(encoding string) *ExportScanner {
	return &ExportScanner{encoding: encoding}
}

// Offset is how many bytes were scanned.
func (s *ExportScanner) Offset() int64 { return s.off }

// Complete says whether the bytes scanned end with the manifest, and nothing after it.
func (s *ExportScanner) Complete() bool { return s.LastKind == KindManifest && s.LastEnd == s.off }

// Write scans p; it never fails.
func (s *ExportScanner) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		var i int
		if s.encoding == EncodingCSV {
			i = bytes.IndexAny(p, "\"\n")
		} else {
			i = bytes.IndexByte(p, '\n')
		}
		if i < 0 {
			s.add(p)
			s.off += int64(len(p))
			return n, nil
		}
		s.add(p[:i+1])
		s.off += int64(i + 1)
		c := p[i]
		p = p[i+1:]
		switch {
		case c == '"':
			s.inQuote = !s.inQuote // "" inside a quoted field toggles twice
		case !s.inQuote:
			s.end()
		}
	}
	return n, nil
}

func (s *ExportScanner) add(b []byte) {
	if s.over {
		return
	}
	if len(s.cur)+len(b) > MaxExportLineBytes+1 {
		s.over = true // not a record an export writes; only its end matters
		return
	}
	s.cur = append(s.cur, b...)
}

func (s *ExportScanner) end() {
	kind := recordKind(s.encoding, s.cur)
	s.LastKind, s.LastEnd = kind, s.off
	switch {
	case s.over:
		s.LastKind = ""
	case kind == KindEvent:
		s.Events++
		s.LastEventEnd = s.off
		s.cur, s.last = s.last, s.cur
		s.LastEvent = s.last
	case kind == KindGap:
		s.Gaps++
	case kind == KindHeader && s.Header == nil:
		s.Header, s.HeaderEnd = bytes.Clone(s.cur), s.off
	case kind == KindManifest:
		s.Manifest = bytes.Clone(s.cur)
	case kind == KindError && s.Error == nil:
		s.Error, s.ErrorStart = bytes.Clone(s.cur), s.off-int64(len(s.cur))
	}
	s.cur, s.over = s.cur[:0], false
}

// object returns the JSON object of a record that is not an event.
func object(encoding string, raw []byte) ([]byte, error) {
	raw = bytes.TrimSuffix(raw, []byte("\n"))
	if encoding == EncodingNDJSON {
		return raw, nil
	}
	f, err := csv.NewReader(bytes.NewReader(raw)).Read()
	if err != nil {
		return nil, err
	}
	if len(f) != 2 {
		return nil, fmt.Errorf("a record of %d fields, want 2", len(f))
	}
	return []byte(f[1]), nil
}

// ParseExportHeader reads a header record (ExportScanner.Header).
func ParseExportHeader(encoding string, raw []byte) (ExportHeader, error) {
	obj, err := object(encoding, raw)
	if err != nil {
		return ExportHeader{}, fmt.Errorf("cannot read the export's header: %w", err)
	}
	var h ExportHeader
	if err := strict(obj, &h); err != nil {
		return ExportHeader{}, fmt.Errorf("cannot read the export's header: %w", err)
	}
	if _, err := h.selection(); err != nil {
		return ExportHeader{}, fmt.Errorf("the export's header: %w", err)
	}
	if h.Encoding != encoding {
		return ExportHeader{}, fmt.Errorf("the export's header says %s, the file is %s", h.Encoding, encoding)
	}
	return h, nil
}

// ExportEventKey is the row key of an event record (ExportScanner.LastEvent): its
// time and id, as a resume cursor needs them.
func ExportEventKey(encoding string, raw []byte) (ExportEventID, error) {
	raw = bytes.TrimSuffix(raw, []byte("\n"))
	var ev exportEvent
	var err error
	if encoding == EncodingNDJSON {
		err = strict(raw, &ev)
	} else {
		var f []string
		if f, err = csv.NewReader(bytes.NewReader(raw)).Read(); err == nil {
			ev, err = eventFromCSV(f)
		}
	}
	if err != nil {
		return ExportEventID{}, fmt.Errorf("cannot read the export's last event: %w", err)
	}
	r, err := ev.row()
	if err != nil {
		return ExportEventID{}, fmt.Errorf("cannot read the export's last event: %w", err)
	}
	return ExportEventID{ID: r.ID, Time: r.Time, Leaf: ev.Leaf}, nil
}

// ExportEventID names an event of an export.
type ExportEventID struct {
	ID   string
	Time time.Time
	Leaf uint64
}

// ExportSummary is what a manifest counts.
type ExportSummary struct {
	Events uint64 `json:"events"`
	Gaps   uint64 `json:"gaps"`
	Size   uint64 `json:"size"`
	KeyID  string `json:"key_id"`
}

// ParseExportManifest reads the counts of a manifest record (unchecked).
func ParseExportManifest(encoding string, raw []byte) (ExportSummary, error) {
	obj, err := object(encoding, raw)
	if err != nil {
		return ExportSummary{}, err
	}
	var m exportManifest
	if err := json.Unmarshal(obj, &m); err != nil || m.Kind != KindManifest {
		return ExportSummary{}, errors.New("not a manifest")
	}
	return ExportSummary{Events: m.Events, Gaps: m.Gaps, Size: m.Size, KeyID: m.KeyID}, nil
}

// ParseExportError reads the message of an error record.
func ParseExportError(encoding string, raw []byte) string {
	obj, err := object(encoding, raw)
	if err != nil {
		return "the server stopped the export"
	}
	var e exportError
	if json.Unmarshal(obj, &e) != nil || e.Error == "" {
		return "the server stopped the export"
	}
	return e.Error
}

// strict decodes one JSON object into v, refusing unknown fields and trailing data.
func strict(obj []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err == nil || !errors.Is(err, io.EOF) {
		return errors.New("data after the object")
	}
	return nil
}
