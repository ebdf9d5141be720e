package inbox_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/contract"
)

func TestStoredID(t *testing.T) {
	long := strings.Repeat("x", inbox.MaxIDLen)
	tests := []struct {
		give   string
		hashed bool
	}{
		{give: "order-1"},
		{give: long},
		{give: "ünïcödé"},
		{give: long + "y", hashed: true},
		{give: "\xff\xfe", hashed: true},
		{give: "nul\x00inside", hashed: true},
		{give: "sha256:0000", hashed: true},
	}
	for _, tt := range tests {
		got := inbox.StoredID(tt.give)
		if tt.hashed {
			assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, got, tt.give)
			assert.Equal(t, got, inbox.StoredID(tt.give), "stable")
		} else {
			assert.Equal(t, tt.give, got)
		}
	}
	assert.NotEqual(t, inbox.StoredID(long+"a"), inbox.StoredID(long+"b"), "no merging by truncation")
	// A raw id spelled like a hash is hashed again, so it cannot collide
	// with the id whose hash it spells.
	h := inbox.StoredID(long + "a")
	assert.NotEqual(t, h, inbox.StoredID(h))
}

func TestDeriveKey(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	k1, err := inbox.DeriveKey(secret, "billing", "m-1")
	require.NoError(t, err)
	require.NoError(t, contract.ValidateKey(k1))
	again, err := inbox.DeriveKey(secret, "billing", "m-1")
	require.NoError(t, err)
	assert.Equal(t, k1, again, "every delivery derives the same key")

	for _, other := range [][2]string{{"billing", "m-2"}, {"mailer", "m-1"}, {"billing:m", "-1"}, {"b", "illing:m-1"}} {
		k, err := inbox.DeriveKey(secret, other[0], other[1])
		require.NoError(t, err)
		assert.NotEqual(t, k1, k, other)
	}

	_, err = inbox.DeriveKey(secret, "billing", "")
	assert.ErrorIs(t, err, inbox.ErrNoMessageID)
	_, err = inbox.DeriveKey(secret, "", "m-1")
	assert.ErrorIs(t, err, inbox.ErrInvalidConsumer)
	_, err = inbox.DeriveKey([]byte("short"), "billing", "m-1")
	assert.ErrorIs(t, err, idemhttp.ErrInvalidKey)
}

func TestSchemaRefusesBadTableNames(t *testing.T) {
	for _, name := range []string{"1abc", "a-b", "a.b", "a b", strings.Repeat("a", 64)} {
		_, err := (&inbox.SQL{Table: name}).Schema()
		assert.ErrorIs(t, err, inbox.ErrInvalidTable, name)
	}
	s, err := (&inbox.SQL{}).Schema()
	require.NoError(t, err)
	assert.Contains(t, s, "CREATE TABLE IF NOT EXISTS idemhttp_inbox")
}

func TestStoredConsumer(t *testing.T) {
	tests := []struct {
		consumer, space string
		want            string
		wantErr         error
	}{
		{consumer: "billing", want: "billing"},
		{consumer: "billing", space: "orders", want: "billing\x1forders"},
		{consumer: "billing", space: "sha256:x", want: "billing\x1f" + inbox.StoredID("sha256:x")},
		{consumer: "billing", space: strings.Repeat("q", 300), want: "billing\x1f" + inbox.StoredID(strings.Repeat("q", 300))},
		{consumer: "", space: "orders", wantErr: inbox.ErrInvalidConsumer},
		{consumer: "bill\x1fing", wantErr: inbox.ErrInvalidConsumer},
		{consumer: "bill\ting", wantErr: inbox.ErrInvalidConsumer},
		{consumer: "bill\x00ing", wantErr: inbox.ErrInvalidConsumer},
		{consumer: "\xff", wantErr: inbox.ErrInvalidConsumer},
	}
	for _, tt := range tests {
		got, err := inbox.StoredConsumer(tt.consumer, tt.space)
		if tt.wantErr != nil {
			assert.ErrorIs(t, err, tt.wantErr, tt.consumer)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tt.want, got)
	}
	// One-to-one: a consumer name cannot spell another's id space.
	a, err := inbox.StoredConsumer("a", "b\x1fc")
	require.NoError(t, err)
	b, err := inbox.StoredConsumer("a", "b")
	require.NoError(t, err)
	assert.NotEqual(t, a, b)
}

// TestDeriveMessageKey checks that the key of a message depends on its id
// space, so that two queues whose ids overlap make different calls; a
// message with no id space gets DeriveKey's key. (With DeriveMessageKey
// ignoring IDSpace, the refunds queue's m-1 was replayed the orders
// queue's response: the first assertion failed.)
func TestDeriveMessageKey(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	orders, err := inbox.DeriveMessageKey(secret, "charger", &inbox.Message{ID: "m-1", IDSpace: "orders"})
	require.NoError(t, err)
	refunds, err := inbox.DeriveMessageKey(secret, "charger", &inbox.Message{ID: "m-1", IDSpace: "refunds"})
	require.NoError(t, err)
	assert.NotEqual(t, orders, refunds)
	again, err := inbox.DeriveMessageKey(secret, "charger", &inbox.Message{ID: "m-1", IDSpace: "orders", Redelivered: true})
	require.NoError(t, err)
	assert.Equal(t, orders, again, "every delivery derives the same key")
	plain, err := inbox.DeriveMessageKey(secret, "charger", &inbox.Message{ID: "m-1"})
	require.NoError(t, err)
	want, err := inbox.DeriveKey(secret, "charger", "m-1")
	require.NoError(t, err)
	assert.Equal(t, want, plain)
	_, err = inbox.DeriveMessageKey(secret, "charger", &inbox.Message{IDSpace: "orders"})
	assert.ErrorIs(t, err, inbox.ErrNoMessageID)
	_, err = inbox.DeriveMessageKey(secret, "char\nger", &inbox.Message{ID: "m-1"})
	assert.ErrorIs(t, err, inbox.ErrInvalidConsumer)
}

func TestRetry(t *testing.T) {
	tests := []struct {
		give       inbox.Retry
		deliveries int
		want       time.Duration
		exhausted  bool
	}{
		{deliveries: 1, want: time.Second},
		{deliveries: 2, want: 2 * time.Second},
		{deliveries: 4, want: 8 * time.Second},
		{deliveries: 5, want: 16 * time.Second, exhausted: true},
		{deliveries: 50, want: inbox.DefaultMaxRetryDelay, exhausted: true},
		{deliveries: 1 << 30, want: inbox.DefaultMaxRetryDelay, exhausted: true},
		{give: inbox.Retry{Delay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, MaxDeliveries: 2}, deliveries: 1, want: 10 * time.Millisecond},
		{give: inbox.Retry{Delay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, MaxDeliveries: 2}, deliveries: 2, want: 20 * time.Millisecond, exhausted: true},
		{give: inbox.Retry{Delay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}, deliveries: 4, want: 50 * time.Millisecond},
		{give: inbox.Retry{Delay: -time.Second}, deliveries: 1, want: time.Second},
		{give: inbox.Retry{MaxDeliveries: -1}, deliveries: 1000, want: inbox.DefaultMaxRetryDelay},
		{give: inbox.Retry{Delay: time.Hour, MaxDelay: time.Minute}, deliveries: 1, want: time.Minute},
		{deliveries: 0, want: time.Second},
		{give: inbox.Retry{Delay: math.MaxInt64 / 3, MaxDelay: math.MaxInt64}, deliveries: 5, want: math.MaxInt64, exhausted: true},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.give.After(tt.deliveries), "%+v after %d", tt.give, tt.deliveries)
		assert.Equal(t, tt.exhausted, tt.give.Exhausted(tt.deliveries), "%+v after %d", tt.give, tt.deliveries)
	}
	n, ok := inbox.Retry{}.Limit()
	assert.True(t, ok)
	assert.Equal(t, inbox.DefaultMaxDeliveries, n)
	_, ok = inbox.Retry{MaxDeliveries: -1}.Limit()
	assert.False(t, ok)
}

// TestReportDeadLetter checks the log line (source, id, deliveries, the
// error and the destination; never the body) and the hook.
func TestReportDeadLetter(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	var got []inbox.DeadLetter
	d := inbox.DeadLetter{
		Message:    &inbox.Message{ID: "m-1", Source: "orders", IDSpace: "orders", Body: []byte("card 4242")},
		Deliveries: 5,
		Err:        errors.New("boom"),
		To:         "the dead-letter exchange of queue orders",
	}
	inbox.ReportDeadLetter(logger, func(d inbox.DeadLetter) { got = append(got, d) }, d)
	require.Len(t, got, 1)
	assert.Equal(t, d, got[0])
	line := buf.String()
	for _, want := range []string{"level=ERROR", "id=m-1", "source=orders", "deliveries=5", "error=boom", `to="the dead-letter exchange of queue orders"`} {
		assert.Contains(t, line, want)
	}
	assert.NotContains(t, line, "4242", "never the body")
	inbox.ReportDeadLetter(logger, nil, inbox.DeadLetter{}) // a nil hook and message are fine
}

type sqlStateError string

func (e sqlStateError) Error() string    { return "sqlstate " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

type codeError int

func (e codeError) Error() string { return "code" }
func (e codeError) Code() int     { return int(e) }

func TestIsUniqueViolation(t *testing.T) {
	tests := []struct {
		give error
		want bool
	}{
		{give: sqlStateError("23505"), want: true},
		{give: fmt.Errorf("wrapped: %w", sqlStateError("23505")), want: true},
		{give: sqlStateError("23503")},
		{give: codeError(1555), want: true},
		{give: codeError(2067), want: true},
		{give: codeError(19)}, // SQLITE_CONSTRAINT alone: could be NOT NULL
		{give: codeError(787)},
		{give: errors.New("duplicate key value violates unique constraint")}, // text is never read
		{give: nil},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, inbox.IsUniqueViolation(tt.give), "%v", tt.give)
	}
}
