package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
)

// readCSV reads operations from CSV whose first row names the columns:
// id (required), method, path and body as in JSON Lines, and any other
// column a body field named by its header (a Stripe form name such as
// metadata[order] is fine). With JSON bodies the fields are strings; a
// body column holds a whole body instead (JSON, or an encoded form), and
// excludes field columns. Empty cells are left out. A malformed row is
// reported in bad and skipped, as a malformed JSON line is; a bad header
// is err: no row could be read right.
func readCSV(r io.Reader, base *url.URL, bodyFormat string) (ops []operation, bad []lineError, err error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = false
	cr.FieldsPerRecord = -1 // counted below, to report a row and go on
	cr.Comment = '#'
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("CSV header: %w", err)
	}
	if len(header) > 0 {
		header[0] = strings.TrimPrefix(header[0], "\ufeff") // a byte order mark, as spreadsheets write
	}
	col := map[string]int{}
	var fields []int
	for i, h := range header {
		h = strings.TrimSpace(h)
		header[i] = h
		if _, dup := col[h]; dup || h == "" {
			return nil, nil, fmt.Errorf("CSV header: column %d: empty or repeated name %q", i+1, h)
		}
		col[h] = i
		switch h {
		case "id", "method", "path", "body":
		default:
			fields = append(fields, i)
		}
	}
	if _, ok := col["id"]; !ok {
		return nil, nil, fmt.Errorf("CSV header: no id column (columns: %s)", strings.Join(header, ", "))
	}
	if _, ok := col["body"]; ok && len(fields) > 0 {
		return nil, nil, fmt.Errorf("CSV header: a body column and field columns (%s) exclude each other", header[fields[0]])
	}
	cell := func(rec []string, name string) string {
		if i, ok := col[name]; ok {
			return rec[i]
		}
		return ""
	}
	seen := map[string]int{}
	for {
		rec, rerr := cr.Read()
		if errors.Is(rerr, io.EOF) {
			return ops, bad, nil
		}
		var pe *csv.ParseError
		switch {
		case errors.As(rerr, &pe):
			bad = append(bad, lineError{pe.StartLine, pe.Err})
			continue
		case rerr != nil:
			return ops, bad, rerr
		}
		// FieldPos only after a record was read: it panics otherwise (found
		// by FuzzReadCSV).
		line, _ := cr.FieldPos(0)
		switch {
		case len(rec) != len(header):
			bad = append(bad, lineError{line, fmt.Errorf("%d cells, want %d as in the header", len(rec), len(header))})
			continue
		}
		op, lerr := csvOperation(rec, cell, header, fields, base, bodyFormat)
		switch {
		case lerr != nil:
			bad = append(bad, lineError{line, lerr})
		case seen[op.ID] != 0:
			bad = append(bad, lineError{line, fmt.Errorf("id %q already used on line %d", op.ID, seen[op.ID])})
		default:
			op.Line = line
			seen[op.ID] = line
			ops = append(ops, op)
		}
	}
}

// csvOperation builds the operation of one row.
func csvOperation(rec []string, cell func([]string, string) string, header []string, fields []int, base *url.URL, bodyFormat string) (operation, error) {
	op, err := newOperation(strings.TrimSpace(cell(rec, "id")), strings.TrimSpace(cell(rec, "method")), strings.TrimSpace(cell(rec, "path")), base)
	if err != nil {
		return operation{}, err
	}
	if b := cell(rec, "body"); b != "" {
		if bodyFormat == bodyForm {
			if _, err := url.ParseQuery(b); err != nil {
				return operation{}, fmt.Errorf("body: not a form-encoded string: %w", err)
			}
			op.Body = []byte(b)
			return op, nil
		}
		var c bytes.Buffer
		if err := json.Compact(&c, []byte(b)); err != nil {
			return operation{}, fmt.Errorf("body: %w", err)
		}
		op.Body = c.Bytes()
		return op, nil
	}
	if len(fields) == 0 {
		return op, nil
	}
	values := url.Values{}
	obj := map[string]string{}
	for _, i := range fields {
		if rec[i] == "" {
			continue
		}
		values.Set(header[i], rec[i])
		obj[header[i]] = rec[i]
	}
	if len(obj) == 0 {
		return op, nil
	}
	if bodyFormat == bodyForm {
		op.Body = []byte(values.Encode())
		return op, nil
	}
	// Sorted keys, no HTML escaping: the same row, the same bytes.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return operation{}, fmt.Errorf("body: %w", err)
	}
	op.Body = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	return op, nil
}
