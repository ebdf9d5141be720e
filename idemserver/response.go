package idemserver

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/idemkit/idemhttp/internal/servercore"
)

// Response is a stored response, decoded: what a replay sends back.
type Response struct {
	Status int         // HTTP status code, 100-999
	Header http.Header // response header as the handler sent it, minus hop-by-hop fields
	Body   []byte      // the whole response body
}

// MarshalBinary encodes r as a record, the form in which a [Store] keeps
// responses: a format byte (1), the status as an unsigned varint, the
// number of header fields, then per field in sorted order its name and its
// values, each string prefixed by its length as a varint, and finally the
// body, which runs to the end of the record. It fails only for a status
// outside 100-999, which no HTTP response has.
func (r *Response) MarshalBinary() ([]byte, error) {
	if r.Status < 100 || r.Status > 999 {
		return nil, fmt.Errorf("idemserver: encode response: invalid status %d", r.Status)
	}
	b := servercore.EncodeHead(r.Status, r.Header, len(r.Body), nil)
	return append(b, r.Body...), nil
}

// UnmarshalBinary decodes a record written by [Response.MarshalBinary] or
// by the middleware, replacing r's contents; it copies what it keeps. It
// refuses a truncated record, an unknown format and a status outside
// 100-999, and allocates no more than the record's size, so a corrupt
// record cannot crash the server. The marker of a request that ran but
// whose response was not kept ([NotReplayableRecord]) holds no response:
// for it, UnmarshalBinary sets only Status (the handler's, 0 if unknown)
// and returns an error wrapping [ErrResponseNotKept].
func (r *Response) UnmarshalBinary(record []byte) error {
	h := http.Header{}
	status, body, err := servercore.ParseRecord(record, h)
	if errors.Is(err, servercore.ErrNotReplayable) {
		*r = Response{Status: status}
		return err
	}
	if err != nil {
		return err
	}
	if len(h) == 0 {
		h = nil
	}
	if len(body) == 0 {
		body = nil
	}
	*r = Response{Status: status, Header: h, Body: slices.Clone(body)}
	return nil
}
