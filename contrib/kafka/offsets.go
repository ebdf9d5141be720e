package kafka

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/inbox"
)

// DefaultOffsetsTable is the table of [SQLOffsets] when its Table is
// empty.
const DefaultOffsetsTable = "idemhttp_kafka_offsets"

// SQLOffsets keeps each partition's next offset in a table of the effects'
// database (PostgreSQL or SQLite, through database/sql), written in the
// transaction of each record's effect: the offsets-in-the-database mode,
// which needs no growing table of message ids. Give it to the consumer
// twice: as [Config.Positions], so that it starts each assigned partition
// where the table says, and through [SQLOffsets.Handle] as
// [Config.Handler].
//
// For each record, in one transaction, Handle advances the partition's row
// to offset+1 only if it is not already past the record (an upsert whose
// WHERE compares offsets), runs the effect if it did, and commits. The row
// also holds the topic's ID (Kafka's topic identity, KIP-516): a topic
// deleted and created again under the same name starts its offsets over,
// and a stored offset of the old incarnation neither skips the new one's
// records nor positions the consumer in it. Records from a cluster that
// gives no topic IDs (older than Kafka 3.1) are stored with none, and
// compared by offset alone. A
// record at or below a processed one is a duplicate and runs nothing, so
// a redelivery after a crash, or the old owner of a partition still
// running after a rebalance, cannot run an effect twice: two members
// processing the same partition wait on its row in turn. A producer's
// retry that wrote a message twice is two records, and runs twice: use
// the inbox when producers retry.
//
// The zero value is not usable: DB must be set. SQLOffsets is safe for
// concurrent use.
type SQLOffsets struct {
	// DB is the database of the effects.
	DB *sql.DB

	// Table is the offsets table's name, a plain identifier; empty means
	// [DefaultOffsetsTable].
	Table string
}

var _ PositionStore = (*SQLOffsets)(nil)

func (o *SQLOffsets) table() (string, error) {
	t := o.Table
	if t == "" {
		t = DefaultOffsetsTable
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') || len(t) > 63 {
			return "", fmt.Errorf("%w: %q", inbox.ErrInvalidTable, t)
		}
	}
	return t, nil
}

// The offsets table's formats, in its format column: 1, the column's
// default, a row of the previous release (no topic_id, which the upgrade
// adds as the empty string: compared by offset alone); 2, this release's.
const offsetsFormat = 2

// Migrate creates the offsets table if it does not exist, and upgrades one
// of the previous release in place: it adds the topic_id column (empty in
// its rows, which are then compared by offset alone) and the format
// column. It is idempotent. An instance of the previous release still
// running during a rolling deploy keeps working on the upgraded table: its
// upsert names neither column, and both releases lock the same row per
// partition.
func (o *SQLOffsets) Migrate(ctx context.Context) error {
	t, err := o.table()
	if err != nil {
		return err
	}
	_, err = o.DB.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
    consumer    text     NOT NULL, -- the consumer group
    topic       text     NOT NULL,
    part        integer  NOT NULL, -- the partition
    next_offset bigint   NOT NULL, -- the offset of the first record not yet processed
    topic_id    text     NOT NULL DEFAULT '', -- the topic's ID in hex, '' when unknown
    format      smallint NOT NULL DEFAULT 1, -- 1: the previous release's row; 2: this one's
    PRIMARY KEY (consumer, topic, part)
)`)
	if err != nil {
		return fmt.Errorf("idemhttp/kafka: migrate offsets: %w", err)
	}
	for _, col := range []string{"topic_id text NOT NULL DEFAULT ''", "format smallint NOT NULL DEFAULT 1"} {
		if err := addColumn(ctx, o.DB, t, col); err != nil {
			return fmt.Errorf("idemhttp/kafka: migrate offsets: upgrade %s: %w", t, err)
		}
	}
	return nil
}

// addColumn adds the column col (its definition) to the table t when t
// has none of that name. It looks first, on PostgreSQL and SQLite alike:
// ALTER TABLE takes the table's strongest lock even when it has nothing
// to do, and SQLite has no ADD COLUMN IF NOT EXISTS.
func addColumn(ctx context.Context, db *sql.DB, t, col string) error {
	name := col[:strings.IndexByte(col, ' ')]
	var n int
	// PostgreSQL: to_regclass resolves t on the search_path, as the
	// statements do. SQLite: pragma_table_info. Whichever answers.
	errPG := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped", t, name).Scan(&n)
	if errPG != nil {
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pragma_table_info($1) WHERE name = $2", t, name).Scan(&n); err != nil {
			return errors.Join(errPG, err)
		}
	}
	if n > 0 {
		return nil
	}
	_, err := db.ExecContext(ctx, "ALTER TABLE "+t+" ADD COLUMN "+col)
	return err
}

// Positions implements [PositionStore]. A stored position of another
// incarnation of the topic than ids names is returned as offset 0, the
// new incarnation's start; one stored without a topic ID is returned as
// it is.
func (o *SQLOffsets) Positions(ctx context.Context, group string, partitions map[string][]int32, ids map[string][16]byte) (map[string]map[int32]int64, error) {
	t, err := o.table()
	if err != nil {
		return nil, err
	}
	rows, err := o.DB.QueryContext(ctx, "SELECT topic, part, next_offset, topic_id FROM "+t+" WHERE consumer = $1", group)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]map[int32]int64)
	for rows.Next() {
		var topic, storedID string
		var part int32
		var next int64
		if err := rows.Scan(&topic, &part, &next, &storedID); err != nil {
			return nil, err
		}
		if _, ok := partitions[topic]; !ok {
			continue
		}
		if id, ok := ids[topic]; ok && storedID != "" && storedID != hex.EncodeToString(id[:]) {
			next = 0 // the topic was deleted and created again
		}
		if out[topic] == nil {
			out[topic] = make(map[int32]int64)
		}
		out[topic][part] = next
	}
	return out, rows.Err()
}

// Handle returns the [inbox.Handler] for [Config.Handler] that runs fn
// once per record of group, in a transaction that also advances the
// partition's stored offset; see [SQLOffsets]. fn must work through tx and
// not commit it; when it fails, everything rolls back and the record is
// retried. Messages that do not come from a [Consumer] (no *kgo.Record in
// Raw) are refused.
func (o *SQLOffsets) Handle(group string, fn func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error) inbox.Handler {
	return func(ctx context.Context, m *inbox.Message) error {
		r, ok := m.Raw.(*kgo.Record)
		if !ok || r == nil {
			return errors.New("idemhttp/kafka: SQLOffsets.Handle: the message is not a Kafka record")
		}
		_, err := o.Process(ctx, group, r, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx, m) })
		return err
	}
}

// Process runs fn for the record r of group unless the stored offset of
// its partition is already past it, in one transaction that advances the
// offset, and reports whether r was a duplicate.
func (o *SQLOffsets) Process(ctx context.Context, group string, r *kgo.Record, fn func(ctx context.Context, tx *sql.Tx) error) (inbox.Result, error) {
	t, err := o.table()
	if err != nil {
		return inbox.Result{}, err
	}
	if group == "" || strings.IndexByte(group, 0) >= 0 {
		return inbox.Result{}, fmt.Errorf("%w: %q", inbox.ErrInvalidConsumer, group)
	}
	tx, err := o.DB.BeginTx(ctx, nil)
	if err != nil {
		return inbox.Result{}, fmt.Errorf("idemhttp/kafka: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	// The upsert takes the partition's row lock, so a second member
	// processing the same partition waits here, then sees the offset the
	// first one committed. Its WHERE leaves the row alone, and reports no
	// row, when the record is behind the stored position of the same
	// incarnation of the topic; a row of another incarnation (both IDs
	// known and different) is the old topic's, and the record's wins.
	var topicID string
	if id, ok := RecordTopicID(r); ok {
		topicID = hex.EncodeToString(id[:])
	}
	res, err := tx.ExecContext(ctx, "INSERT INTO "+t+" AS o (consumer, topic, part, next_offset, topic_id, format) VALUES ($1, $2, $3, $4, $6, "+strconv.Itoa(offsetsFormat)+")"+
		" ON CONFLICT (consumer, topic, part) DO UPDATE SET next_offset = excluded.next_offset, format = excluded.format,"+
		" topic_id = CASE WHEN excluded.topic_id = '' THEN o.topic_id ELSE excluded.topic_id END"+
		" WHERE o.next_offset <= $5 OR (o.topic_id <> '' AND excluded.topic_id <> '' AND o.topic_id <> excluded.topic_id)",
		group, r.Topic, r.Partition, r.Offset+1, r.Offset, topicID)
	if err != nil {
		return inbox.Result{}, fmt.Errorf("idemhttp/kafka: advance offset: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return inbox.Result{}, fmt.Errorf("idemhttp/kafka: advance offset: %w", err)
	}
	if n == 0 {
		return inbox.Result{Duplicate: true}, nil
	}
	if err := fn(ctx, tx); err != nil {
		return inbox.Result{}, err
	}
	if err := tx.Commit(); err != nil {
		return inbox.Result{}, fmt.Errorf("idemhttp/kafka: commit (outcome unknown; a redelivery is safe): %w", err)
	}
	committed = true
	return inbox.Result{}, nil
}
