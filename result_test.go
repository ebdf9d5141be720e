package idemhttp

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gzipped answers 201 with a JSON charge, gzip-encoded when the request
// accepts gzip, as most APIs behind a CDN do.
func gzipped(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	body := []byte(`{"id":"ch_gz_1"}`)
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write(body)
		_ = zw.Close()
		w.Header().Set("Content-Encoding", "gzip")
		body = b.Bytes()
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// readAll reads and closes resp's body.
func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return b
}

// gunzip decodes b, failing the test if it is not gzip.
func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err, "a gzip body")
	out, err := io.ReadAll(zr)
	require.NoError(t, err)
	return out
}

// Issue 31 §1.6: a kept result replays what the caller read. When
// net/http decoded the body (the caller set no Accept-Encoding), the copy
// is decoded and has no Content-Encoding; when the caller asked for gzip
// itself, net/http left the body encoded, and the copy keeps it encoded
// with its Content-Encoding, so the replayed charge id is readable the
// way the first one was. Checked to fail with Content-Encoding left out
// of the kept headers (the replay's gzip bytes came without it).
func TestKeptResultKeepsItsEncoding(t *testing.T) {
	tests := []struct {
		name          string
		acceptGzip    bool // the caller sets Accept-Encoding itself
		wantEncodings []string
	}{
		{name: "decoded by net/http", acceptGzip: false, wantEncodings: nil},
		{name: "asked for by the caller", acceptGzip: true, wantEncodings: []string{"gzip"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, gzipped)
			c := &Client{Policy: &Policy{KeepResults: 1 << 10}}
			call := func() *http.Response {
				req := post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-gz"))
				if tt.acceptGzip {
					req.Header.Set("Accept-Encoding", "gzip")
				}
				resp, err := c.Do(req)
				require.NoError(t, err)
				return resp
			}
			read := func(resp *http.Response) []byte {
				b := readAll(t, resp)
				if resp.Header.Get("Content-Encoding") == "gzip" {
					return gunzip(t, b)
				}
				return b
			}
			first := call()
			assert.Equal(t, tt.wantEncodings, first.Header.Values("Content-Encoding"))
			assert.Equal(t, `{"id":"ch_gz_1"}`, string(read(first)))

			again := call()
			assert.True(t, Replayed(again), "the kept result")
			assert.Equal(t, tt.wantEncodings, again.Header.Values("Content-Encoding"), "as the caller read it first")
			assert.Equal(t, `{"id":"ch_gz_1"}`, string(read(again)), "the charge id is readable")
			assert.Len(t, srv.Hits(), 1, "the rerun sent nothing")
		})
	}
}

// Issue 31 §1.7: no credential reaches the journal through a kept
// result. A presigned URL's signature and credential, a secret query
// value and a user part in Location, Content-Location and Link are
// redacted in the copy (and so in a replay), by the defaults and by the
// policy's own RedactQuery names; the call that got the response reads it
// whole. Checked to fail with keepResult passing nil names (the policy's
// partner_sig stayed) and with Location's redaction removed from
// contract.ResultHeader.
func TestKeptResultHoldsNoCredential(t *testing.T) {
	presigned := "https://b.s3.amazonaws.com/up?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2Fsecret&X-Amz-Signature=secretsig&partner_sig=secretp"
	srv := newScripted(t, reply(http.StatusCreated, `{"id":"up_1"}`,
		"Location", presigned,
		"Content-Location", "https://u:secretpw@h/c/1#token=secret",
		"Link", `</files/1?access_token=secret>; rel="self"`,
		"Set-Cookie", "session=secret",
		"X-Debug-Token", "secret",
	))
	j := newMemJournal(DefaultPolicy().Retention)
	c := &Client{Journal: j, Policy: &Policy{KeepResults: 1 << 10, RedactQuery: []string{"partner_sig"}}}
	call := func() *http.Response {
		resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-up")))
		require.NoError(t, err)
		readAll(t, resp)
		return resp
	}
	first := call()
	assert.Equal(t, presigned, first.Header.Get("Location"), "the caller reads it whole")

	e, err := j.Lookup(context.Background(), "op-up")
	require.NoError(t, err)
	e, err = j.Get(context.Background(), e.Key)
	require.NoError(t, err)
	require.NotNil(t, e.Result)
	assert.Equal(t, http.Header{
		"Content-Type":     {"text/plain; charset=utf-8"},
		"Location":         {"https://b.s3.amazonaws.com/up?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&partner_sig=REDACTED"},
		"Content-Location": {"https://REDACTED@h/c/1"},
		"Link":             {`</files/1?access_token=REDACTED>; rel="self"`},
		"Date":             e.Result.Header.Values("Date"),
	}, e.Result.Header)

	again := call()
	assert.True(t, Replayed(again))
	assert.Equal(t, e.Result.Header.Get("Location"), again.Header.Get("Location"), "the replay reads the kept copy")
	for name, vals := range again.Header {
		for _, v := range vals {
			assert.NotContains(t, v, "secret", name)
		}
	}
	assert.Len(t, srv.Hits(), 1)
}
