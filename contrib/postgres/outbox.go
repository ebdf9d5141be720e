package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/inbox"
)

// Outbox is the producer-side partner of [Inbox]: a transactional outbox
// in the idemhttp_outbox table (created by [Migrate]). A service that must
// both change its database and publish a message writes the message with
// [Outbox.Add] in the business transaction, so the two commit together;
// [Outbox.Relay] then publishes committed messages and deletes them.
//
// Each message carries an id fixed when it is added, and the relay sends
// it with that id on every attempt: a relay that crashes after publishing
// and before deleting publishes the message again under the same id, and
// the consumers' inboxes drop the copy. That is the producer-assigned id
// the inbox needs (see the [inbox] package documentation); put it in the
// broker's id header or property.
//
// An Outbox is safe for concurrent use. Several relays may run at once:
// each claims different rows (FOR UPDATE SKIP LOCKED), at the cost of
// publishing in an order that is no longer the order of Add.
type Outbox struct {
	db DB
}

// NewOutbox returns an Outbox on db, which must reach the primary.
func NewOutbox(db DB) *Outbox { return &Outbox{db: db} }

// OutboxMessage is a message waiting in the outbox.
type OutboxMessage struct {
	// ID is the message's stable id: send it as the message id header. Add
	// mints one ([idemhttp.NewKey]) when empty; a caller's own id must be
	// at most [inbox.MaxIDLen] bytes of valid UTF-8.
	ID string

	// Topic names where the message goes (a topic, exchange, subject,
	// queue); required.
	Topic string

	// Key is the broker's partitioning key, if any.
	Key []byte

	// Body is the payload.
	Body []byte

	// Header holds headers to send with the message; nil for none.
	Header map[string][]string

	// Created is when Add wrote the message (the database's clock); set by
	// Relay.
	Created time.Time
}

// Add writes m into the outbox within tx, the caller's business
// transaction, and returns its id. Nothing is published until tx commits;
// if tx rolls back, neither is the message. An id already in the outbox
// is an error (a unique violation) that aborts tx.
func (o *Outbox) Add(ctx context.Context, tx pgx.Tx, m OutboxMessage) (string, error) {
	if m.Topic == "" {
		return "", errors.New("idemhttp/postgres: outbox: message has no topic")
	}
	if m.ID == "" {
		m.ID = idemhttp.NewKey()
	} else if inbox.StoredID(m.ID) != m.ID {
		return "", fmt.Errorf("idemhttp/postgres: outbox: id must be at most %d bytes of UTF-8 without NUL and not start with \"sha256:\"", inbox.MaxIDLen)
	}
	if m.Header == nil {
		m.Header = map[string][]string{}
	}
	_, err := tx.Exec(ctx, `INSERT INTO idemhttp_outbox (id, topic, key, body, header) VALUES ($1, $2, $3, $4, $5)`,
		m.ID, m.Topic, m.Key, m.Body, m.Header)
	if err != nil {
		return "", fmt.Errorf("idemhttp/postgres: outbox: add: %w", err)
	}
	return m.ID, nil
}

// Relay claims up to limit committed messages, oldest first, passes them
// to send, and deletes them once send returns nil, all in one
// transaction; it returns how many it relayed. When send fails, nothing
// is deleted and Relay returns the error: the messages are sent again by
// a later Relay, with the same ids. send must publish every message it is
// given (with its ID as the message id) and return nil only when the
// broker has acknowledged them all. Call Relay in a loop; it returns 0
// when the outbox is empty.
func (o *Outbox) Relay(ctx context.Context, limit int, send func(ctx context.Context, ms []OutboxMessage) error) (int, error) {
	if limit <= 0 {
		return 0, errors.New("idemhttp/postgres: outbox: relay limit must be positive")
	}
	var n int
	err := pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT seq, id, topic, key, body, header, created_at FROM idemhttp_outbox
ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`, limit)
		if err != nil {
			return err
		}
		var seqs []int64
		var ms []OutboxMessage
		for rows.Next() {
			var seq int64
			var m OutboxMessage
			if err := rows.Scan(&seq, &m.ID, &m.Topic, &m.Key, &m.Body, &m.Header, &m.Created); err != nil {
				rows.Close()
				return err
			}
			seqs = append(seqs, seq)
			ms = append(ms, m)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(ms) == 0 {
			return nil
		}
		if err := send(ctx, ms); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		// The rows stay locked by this transaction, so no other relay
		// sent them meanwhile. A crash from here to the commit sends
		// them again, under the same ids.
		if _, err := tx.Exec(ctx, `DELETE FROM idemhttp_outbox WHERE seq = ANY($1)`, seqs); err != nil {
			return err
		}
		n = len(ms)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("idemhttp/postgres: outbox: relay: %w", err)
	}
	return n, nil
}
