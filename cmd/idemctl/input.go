package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/idemkit/idemhttp/internal/contract"
)

// maxLineBytes bounds an input line: the library refuses bodies above
// 8 MiB (Policy.MaxBodyBytes), and a line is a body plus a little.
const maxLineBytes = 8<<20 + 64<<10

// inputFormat documents the batch input, for the usage text and README.md.
const inputFormat = `Input: JSON Lines or CSV (-in-format auto: .csv or a first line not starting with { or #
means CSV). JSON Lines: one object per line; blank lines and lines starting with # are skipped.
  {"id":"charge-0001","body":{"amount":1000,"currency":"usd"}}
  {"id":"refund-0002","method":"POST","path":"/v1/refunds","body":{"charge":"ch_1"}}
Fields:
  id      required: the operation id, 1-255 printable ASCII, unique in the file. It names the
          operation across reruns: its key is derived from it.
  body    optional: any JSON value, sent compacted as application/json. With -body-format form,
          an object sent as a form (a=1&nested[b]=2&list[0]=3, as Stripe reads it), or a string
          holding an encoded form. Absent or null: no body.
  method  optional: the HTTP method, POST by default.
  path    optional: a path with an optional ?query, resolved against -url as a link is:
          "/v1/refunds" replaces -url's path, "refunds" its last segment. Absent: -url itself.
          Always on -url's server: credentials never go elsewhere.
CSV: a header row names the columns: id, method, path as above, and either a body column (the
whole body: JSON, or an encoded form) or any number of field columns, each a body field named by
its header (metadata[order] is fine), sent as a form or as a JSON object of strings. Empty cells
are left out.
  id,amount,currency,metadata[order]
  charge-0001,1000,usd,o-1
`

// operation is one valid input line.
type operation struct {
	Line   int    // 1-based line number in the input
	ID     string // the operation id
	Method string // HTTP method
	URL    string // absolute request URL
	Body   []byte // compacted JSON, nil for no body

	// resume is set when an earlier run left the operation pending: the
	// send resends it with its journaled key.
	resume bool
	// key is the key the journal holds for the operation, "" if none.
	key string
	// header, when set, is the journaled request's header (a resend of a
	// shared journal's entry), sent instead of the input's Content-Type.
	header http.Header
}

// lineError is a malformed input line.
type lineError struct {
	Line int
	Err  error
}

func (e lineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// inputLine is the JSON shape of a line.
type inputLine struct {
	ID     string          `json:"id"`
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Body   json.RawMessage `json:"body"`
}

// The input formats (-in-format) and body formats (-body-format).
const (
	formatJSONL = "jsonl"
	formatCSV   = "csv"
	bodyJSON    = "json"
	bodyForm    = "form"
)

// inputSpec says how to read an input: its format and how bodies are
// encoded.
type inputSpec struct {
	format string // formatJSONL or formatCSV
	body   string // bodyJSON or bodyForm
}

// contentType is the Content-Type of the requests' bodies.
func (s inputSpec) contentType() string {
	if s.body == bodyForm {
		return "application/x-www-form-urlencoded"
	}
	return "application/json"
}

// readInput reads JSON Lines with JSON bodies: readInputAs with the
// defaults.
func readInput(r io.Reader, base *url.URL) (ops []operation, bad []lineError, err error) {
	return readInputAs(r, base, inputSpec{format: formatJSONL, body: bodyJSON})
}

// readInputAs reads the operations in r, resolving paths against base. A
// malformed line is reported in bad and skipped; the others are kept, so
// one typo does not hold up a batch. err is non-nil only when r itself
// fails, or a CSV input has no usable header.
func readInputAs(r io.Reader, base *url.URL, spec inputSpec) (ops []operation, bad []lineError, err error) {
	if spec.format == formatCSV {
		return readCSV(r, base, spec.body)
	}
	br := bufio.NewReaderSize(r, 64<<10)
	seen := make(map[string]int)
	for n := 1; ; n++ {
		line, tooLong, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			return ops, bad, err
		}
		if tooLong {
			bad = append(bad, lineError{n, fmt.Errorf("longer than %d bytes", maxLineBytes)})
		} else if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			op, lerr := parseLine(t, base, spec.body)
			switch {
			case lerr != nil:
				bad = append(bad, lineError{n, lerr})
			case seen[op.ID] != 0:
				bad = append(bad, lineError{n, fmt.Errorf("id %q already used on line %d", op.ID, seen[op.ID])})
			default:
				op.Line = n
				seen[op.ID] = n
				ops = append(ops, op)
			}
		}
		if errors.Is(err, io.EOF) {
			return ops, bad, nil
		}
	}
}

// readLine returns the next line without its end, reading and dropping
// whatever exceeds maxLineBytes so that the lines after a huge one keep
// their numbers.
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > maxLineBytes {
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(buf, "\r\n"), tooLong, err
	}
}

// parseLine decodes and validates one line.
func parseLine(b []byte, base *url.URL, bodyFormat string) (operation, error) {
	var in inputLine
	dec := json.NewDecoder(bytes.NewReader(b))
	// A misspelt field ("bdy") must not silently send an empty request.
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return operation{}, fmt.Errorf("not a JSON object of id, body, method, path: %w", err)
	}
	if dec.More() {
		return operation{}, errors.New("more than one JSON value on the line")
	}
	op, err := newOperation(in.ID, in.Method, in.Path, base)
	if err != nil {
		return operation{}, err
	}
	if len(in.Body) == 0 || bytes.Equal(in.Body, []byte("null")) {
		return op, nil
	}
	if bodyFormat == bodyForm {
		op.Body, err = formFromJSON(in.Body)
		return op, err
	}
	// Compacted, so reformatting the file between runs does not
	// change the request and trip the journal's fingerprint check.
	var c bytes.Buffer
	if err := json.Compact(&c, in.Body); err != nil {
		return operation{}, fmt.Errorf("body: %w", err)
	}
	op.Body = c.Bytes()
	return op, nil
}

// newOperation validates an operation's id, method and path.
func newOperation(id, method, path string, base *url.URL) (operation, error) {
	if id == "" {
		return operation{}, errors.New(`missing "id"`)
	}
	// The id becomes the journal's operation id, which follows the key
	// rules: stored, printed, compared byte for byte.
	if err := contract.ValidateKey(id); err != nil {
		return operation{}, fmt.Errorf("id %q: %w", id, err)
	}
	op := operation{ID: id, Method: http.MethodPost}
	if method != "" {
		if !validHeaderName(method) { // a method is a token too
			return operation{}, fmt.Errorf("method %q is not a valid HTTP method", method)
		}
		op.Method = strings.ToUpper(method)
	}
	u, err := resolve(base, path)
	if err != nil {
		return operation{}, err
	}
	op.URL = u
	return op, nil
}

// resolve resolves path (with an optional query) against base as a link
// is (RFC 3986): "/v1/refunds" replaces base's path, "refunds" replaces
// its last segment. A scheme or host is refused, so an input file can never
// send the credentials of -header to another server.
func resolve(base *url.URL, path string) (string, error) {
	if path == "" {
		return base.String(), nil
	}
	rel, err := url.Parse(path)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("path %q: %w", path, err)
	}
	if rel.Scheme != "" || rel.Host != "" || rel.User != nil || rel.Fragment != "" || strings.HasPrefix(path, "//") {
		return "", fmt.Errorf("path %q: want a path with an optional query, on -url's server", path)
	}
	return base.ResolveReference(rel).String(), nil
}

// parseBaseURL validates -url.
func parseBaseURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("-url is required")
	}
	u, err := url.Parse(s)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("-url is not a valid URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("-url %s: want an absolute http or https URL", u.Redacted())
	}
	if u.User != nil {
		// The journal stores URLs without passwords, so a resend would
		// go without them; and they belong out of the process list.
		return nil, fmt.Errorf("-url %s: credentials in the URL are not supported: pass them with -header-env 'Authorization=VAR'", u.Redacted())
	}
	return u, nil
}
