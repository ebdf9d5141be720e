package main

import (
	"bufio"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

func TestReadInput(t *testing.T) {
	base := "https://api.example.com/v1/charges"
	tests := []struct {
		name    string
		give    string
		wantOps []operation
		wantBad []int // line numbers of the malformed lines
	}{
		{
			name:    "defaults",
			give:    `{"id":"a","body":{"amount":1}}`,
			wantOps: []operation{{Line: 1, ID: "a", Method: "POST", URL: base, Body: []byte(`{"amount":1}`)}},
		},
		{
			name:    "body compacted, so reformatting changes nothing",
			give:    `{"id":"a", "body": { "amount" : 1 ,"c":[1, 2] } }`,
			wantOps: []operation{{Line: 1, ID: "a", Method: "POST", URL: base, Body: []byte(`{"amount":1,"c":[1,2]}`)}},
		},
		{
			name:    "method and absolute path",
			give:    `{"id":"a","method":"put","path":"/v1/refunds/re_1?expand=x"}`,
			wantOps: []operation{{Line: 1, ID: "a", Method: "PUT", URL: "https://api.example.com/v1/refunds/re_1?expand=x"}},
		},
		{
			name:    "relative path replaces the last segment",
			give:    `{"id":"a","path":"refunds"}`,
			wantOps: []operation{{Line: 1, ID: "a", Method: "POST", URL: "https://api.example.com/v1/refunds"}},
		},
		{
			name:    "null body is no body",
			give:    `{"id":"a","body":null}`,
			wantOps: []operation{{Line: 1, ID: "a", Method: "POST", URL: base}},
		},
		{
			name:    "blank lines, comments and CRLF",
			give:    "# charges\r\n\r\n  \n{\"id\":\"a\"}\r\n",
			wantOps: []operation{{Line: 4, ID: "a", Method: "POST", URL: base}},
		},
		{
			name: "malformed lines are skipped, the rest kept",
			give: strings.Join([]string{
				`{"id":"a"}`,
				`{not json`,
				`{"id":""}`,
				`{"id":"b","bdy":{}}`,
				`{"id":"a"}`,
				`{"id":"c"} {"id":"d"}`,
				`{"id":"bad\u0001id"}`,
				`{"id":"e","path":"https://evil.example/steal"}`,
				`{"id":"f","path":"//evil.example/steal"}`,
				`{"id":"g","method":"GE T"}`,
				`["id","h"]`,
				`{"id":"i"}`,
			}, "\n"),
			wantOps: []operation{
				{Line: 1, ID: "a", Method: "POST", URL: base},
				{Line: 12, ID: "i", Method: "POST", URL: base},
			},
			wantBad: []int{2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ops, bad, err := readInput(strings.NewReader(tt.give), mustURL(t, base))
			require.NoError(t, err)
			assert.Equal(t, tt.wantOps, ops)
			assert.Equal(t, tt.wantBad, lineNumbers(bad))
		})
	}
}

func lineNumbers(bad []lineError) []int {
	var out []int
	for _, b := range bad {
		out = append(out, b.Line)
	}
	return out
}

func TestReadInputLongLine(t *testing.T) {
	long := `{"id":"x","body":"` + strings.Repeat("a", maxLineBytes) + `"}`
	give := `{"id":"a"}` + "\n" + long + "\n" + `{"id":"b"}`

	ops, bad, err := readInput(strings.NewReader(give), mustURL(t, "http://h/"))

	require.NoError(t, err)
	assert.Equal(t, []int{2}, lineNumbers(bad))
	require.Len(t, ops, 2)
	assert.Equal(t, 3, ops[1].Line, "lines after a long one keep their numbers")
}

func TestReadLineAtBufferBoundary(t *testing.T) {
	// A line longer than the reader's buffer arrives in several slices.
	br := bufio.NewReaderSize(strings.NewReader(strings.Repeat("x", 100)+"\nrest"), 16)

	line, tooLong, err := readLine(br)

	require.NoError(t, err)
	assert.False(t, tooLong)
	assert.Equal(t, strings.Repeat("x", 100), string(line))
}

func TestParseBaseURL(t *testing.T) {
	tests := []struct {
		give    string
		wantErr string
	}{
		{give: "https://api.example.com/v1/charges"},
		{give: "http://127.0.0.1:8080"},
		{give: "", wantErr: "-url is required"},
		{give: "api.example.com/v1", wantErr: "absolute http or https"},
		{give: "ftp://example.com", wantErr: "absolute http or https"},
		{give: "http://user:hunter2@[::1", wantErr: "not a valid URL"},
		{give: "https://user:hunter2@api.example.com/", wantErr: "credentials in the URL are not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			_, err := parseBaseURL(tt.give)
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.NotContains(t, err.Error(), "hunter2", "a URL's password is never printed")
		})
	}
}

func TestCredentialFlags(t *testing.T) {
	env := map[string]string{"API_KEY": "k_secret_from_env"}
	tests := []struct {
		name    string
		give    []string
		want    http.Header
		wantErr string
	}{
		{
			name: "header and header-env",
			give: []string{"-header", "Authorization: Bearer sk_1", "-header-env", "X-Api-Key=API_KEY"},
			want: http.Header{"Authorization": {"Bearer sk_1"}, "X-Api-Key": {"k_secret_from_env"}},
		},
		{
			name: "repeated header",
			give: []string{"-header", "X-A: 1", "-header", "x-a: 2"},
			want: http.Header{"X-A": {"1", "2"}},
		},
		{
			name:    "no colon",
			give:    []string{"-header", "Authorization Bearer sk_live_TOPSECRET"},
			wantErr: "-header: want 'Name: value' (value not shown)",
		},
		{
			name:    "bad name",
			give:    []string{"-header", "Bad Name: sk_live_TOPSECRET"},
			wantErr: "-header: want 'Name: value' (value not shown)",
		},
		{
			name:    "idempotency key",
			give:    []string{"-header", "Idempotency-Key: sk_live_TOPSECRET"},
			wantErr: "idemctl sets the idempotency key itself",
		},
		{
			name:    "line break",
			give:    []string{"-header", "X-A: sk_live_TOPSECRET\r\nX-B: 2"},
			wantErr: "line break",
		},
		{
			name:    "unset variable",
			give:    []string{"-header-env", "X-Api-Key=NOPE"},
			wantErr: "environment variable NOPE is empty or unset",
		},
		{
			name:    "header-env without variable",
			give:    []string{"-header-env", "X-Api-Key"},
			wantErr: "-header-env: want 'Name=VAR'",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := credentialFlags{getenv: func(k string) string { return env[k] }}
			var out strings.Builder
			fs := newFlagSet("test", "", writerEnv(&out))
			c.register(fs)

			require.NoError(t, fs.Parse(tt.give))
			err := c.check()

			assert.NotContains(t, out.String(), "TOPSECRET", "the flag package never prints a value")
			if tt.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.want, c.headers)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.NotContains(t, err.Error(), "TOPSECRET", "an error never shows a header's value")
		})
	}
}

// writerEnv is an environment whose stdout and stderr are both w.
func writerEnv(w io.Writer) env { return env{stdout: w, stderr: w} }
