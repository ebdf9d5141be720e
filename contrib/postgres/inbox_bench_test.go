package postgres_test

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/inbox"
)

// BenchmarkInbox measures one consumer's messages per second on
// PostgreSQL: each message's effect is one INSERT into a business table
// (with a bigserial primary key, as a ledger would have),
// in a transaction per message ("single") or per batch of 100
// ("batch100"). Each iteration runs the same work four ways, in turn and
// in a rotating order, so that the machine's noise hits all of them alike:
// "baseline" is the consumer doing only its business insert in that
// transaction, with pgx; "inbox" adds pgx's Inbox; "sql-baseline" is the
// baseline through database/sql (pgx's stdlib driver) and "sql" adds
// inbox.SQL to it. The metrics are each way's messages per second and
// each inbox's ratio to its own baseline. Every message id is
// new: a duplicate is cheaper (nothing runs).
func BenchmarkInbox(b *testing.B) {
	ctx := context.Background()
	for _, batch := range []int{1, 100} {
		name := "single"
		if batch > 1 {
			name = "batch" + strconv.Itoa(batch)
		}
		b.Run(name, func(b *testing.B) {
			s := newSchema(b)
			pool := s.pool(b, 4)
			// A ledger-like business table: its own key, the message's id.
			_, err := pool.Exec(ctx, "CREATE TABLE d1_effects (seq bigserial PRIMARY KEY, consumer text NOT NULL, id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())")
			require.NoError(b, err)
			in := postgres.NewInbox(pool)
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			sqlIn := &inbox.SQL{DB: db}

			insert := func(ctx context.Context, tx pgx.Tx, id string) error {
				_, err := tx.Exec(ctx, "INSERT INTO d1_effects (consumer, id) VALUES ($1, $2)", "bench", id)
				return err
			}
			n := 0
			ids := make([]string, batch)
			nextIDs := func() {
				for j := range ids {
					n++
					ids[j] = "m-" + strconv.Itoa(n)
				}
			}
			ways := []func() error{
				func() error { // baseline
					return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						for _, id := range ids {
							if err := insert(ctx, tx, id); err != nil {
								return err
							}
						}
						return nil
					})
				},
				func() error { // inbox
					_, err := in.ProcessBatch(ctx, "bench", ids, func(ctx context.Context, tx pgx.Tx, j int) error { return insert(ctx, tx, ids[j]) })
					return err
				},
				func() error { // sql-baseline
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					for _, id := range ids {
						if _, err := tx.ExecContext(ctx, "INSERT INTO d1_effects (consumer, id) VALUES ($1, $2)", "bench", id); err != nil {
							return err
						}
					}
					return tx.Commit()
				},
				func() error { // sql
					_, err := sqlIn.ProcessBatch(ctx, "bench", ids, func(ctx context.Context, tx *sql.Tx, j int) error {
						_, err := tx.ExecContext(ctx, "INSERT INTO d1_effects (consumer, id) VALUES ($1, $2)", "bench", ids[j])
						return err
					})
					return err
				},
			}
			var spent [4]time.Duration
			var ratios [2][]float64 // per round: each baseline's time over its inbox's
			rounds := 0
			for b.Loop() {
				var took [4]time.Duration
				for k := range ways {
					w := (k + rounds) % len(ways)
					nextIDs()
					start := time.Now()
					require.NoError(b, ways[w]())
					took[w] = time.Since(start)
					spent[w] += took[w]
				}
				ratios[0] = append(ratios[0], took[0].Seconds()/took[1].Seconds())
				ratios[1] = append(ratios[1], took[2].Seconds()/took[3].Seconds())
				rounds++
			}
			msgs := float64(rounds * batch)
			b.ReportMetric(msgs/spent[0].Seconds(), "baseline-msgs/s")
			b.ReportMetric(msgs/spent[1].Seconds(), "inbox-msgs/s")
			b.ReportMetric(msgs/spent[2].Seconds(), "sql-baseline-msgs/s")
			b.ReportMetric(msgs/spent[3].Seconds(), "sql-msgs/s")
			// The median of the rounds' ratios: a burst of load from
			// elsewhere lands on one round's three runs alike, or on one
			// of them, which the median discards.
			b.ReportMetric(median(ratios[0]), "inbox/baseline")
			b.ReportMetric(median(ratios[1]), "sql/sql-baseline")
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// BenchmarkInboxHandle measures what an id space costs a message: Handle
// from a queue (the message's row, and its copy under the consumer's
// plain name for the previous release's instances, in one round trip)
// against Process under the plain name (one row), each message in its own
// transaction with one business insert, in turn in a rotating order. The
// metric is the median of the rounds' ratios, handle over process
// throughput.
func BenchmarkInboxHandle(b *testing.B) {
	ctx := context.Background()
	s := newSchema(b)
	pool := s.pool(b, 4)
	_, err := pool.Exec(ctx, "CREATE TABLE d1_effects (seq bigserial PRIMARY KEY, consumer text NOT NULL, id text NOT NULL)")
	require.NoError(b, err)
	in := postgres.NewInbox(pool)
	insert := func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, "INSERT INTO d1_effects (consumer, id) VALUES ($1, $2)", "bench", id)
		return err
	}
	h := in.Handle("bench", func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error { return insert(ctx, tx, m.ID) })
	n := 0
	ways := []func() error{
		func() error { // process
			n++
			id := "p-" + strconv.Itoa(n)
			_, err := in.Process(ctx, "bench", id, func(ctx context.Context, tx pgx.Tx) error { return insert(ctx, tx, id) })
			return err
		},
		func() error { // handle
			n++
			return h(ctx, &inbox.Message{ID: "h-" + strconv.Itoa(n), IDSpace: "orders"})
		},
	}
	var ratios []float64
	rounds := 0
	for b.Loop() {
		var took [2]time.Duration
		for k := range ways {
			w := (k + rounds) % len(ways)
			start := time.Now()
			require.NoError(b, ways[w]())
			took[w] = time.Since(start)
		}
		ratios = append(ratios, took[0].Seconds()/took[1].Seconds())
		rounds++
	}
	b.ReportMetric(median(ratios), "handle/process")
}
