package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/contrib/sqlite"
	"github.com/idemkit/idemhttp/internal/testenv"
)

// baselineOffsets is what the previous release's SQLOffsets stored
// (testdata/baseline, made by commit 2d053bb: see its README): group ->
// topic -> partition -> the offsets it processed.
type baselineOffsets struct {
	Offsets map[string]map[string]map[string][]int64 `json:"offsets"`
}

// The statement with which the previous release advanced a partition's
// offset, sent verbatim by the test that plays one of its instances beside
// this release.
const oldAdvance = "INSERT INTO idemhttp_kafka_offsets AS o (consumer, topic, part, next_offset) VALUES ($1, $2, $3, $4)" +
	" ON CONFLICT (consumer, topic, part) DO UPDATE SET next_offset = excluded.next_offset WHERE o.next_offset <= $5"

// Issue 30 §4: the offsets table the previous release wrote, on SQLite
// and on PostgreSQL, is upgraded in place by Migrate, and this release
// reads it: the consumer starts each partition where it stood, every
// record processed then is a duplicate, the next one runs, and an
// instance of the previous release still running beside it keeps working
// on the same rows. (With Migrate only creating a missing table, topic_id
// never came, Positions failed and the consumer stopped: this test
// failed.)
func TestSQLOffsetsUpgrade(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "baseline", "manifest.json"))
	require.NoError(t, err)
	var want baselineOffsets
	require.NoError(t, json.Unmarshal(raw, &want))
	engines := map[string]func(t *testing.T) *sql.DB{
		"sqlite": func(t *testing.T) *sql.DB {
			db, err := sqlite.Open(filepath.Join(t.TempDir(), "offsets.db"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			return db
		},
		"postgres": func(t *testing.T) *sql.DB {
			return testenv.NewSchema(t, "d1_kafka_").Open(t)
		},
	}
	for engine, open := range engines {
		t.Run(engine, func(t *testing.T) {
			ctx := context.Background()
			db := open(t)
			dump, err := os.ReadFile(filepath.Join("testdata", "baseline", engine+".sql"))
			require.NoError(t, err)
			_, err = db.Exec(string(dump))
			require.NoError(t, err, "load the previous release's table")
			offs := &kafka.SQLOffsets{DB: db}
			require.NoError(t, offs.Migrate(ctx), "upgrade in place")
			require.NoError(t, offs.Migrate(ctx), "again")

			parts := map[string][]int32{}
			next := map[string]map[int32]int64{}
			for topic, ps := range want.Offsets["billing"] {
				next[topic] = map[int32]int64{}
				for p, done := range ps {
					n, err := strconv.Atoi(p)
					require.NoError(t, err)
					parts[topic] = append(parts[topic], int32(n))
					next[topic][int32(n)] = done[len(done)-1] + 1
				}
			}
			got, err := offs.Positions(ctx, "billing", parts, map[string][16]byte{"orders": {7}})
			require.NoError(t, err)
			assert.Equal(t, next, got, "each partition where the previous release left it (no topic ID stored: by offset alone)")

			for topic, ps := range want.Offsets["billing"] {
				for p, done := range ps {
					n, _ := strconv.Atoi(p)
					for _, off := range done {
						res, err := offs.Process(ctx, "billing", &kgo.Record{Topic: topic, Partition: int32(n), Offset: off}, func(context.Context, *sql.Tx) error {
							t.Errorf("%s/%d@%d processed before the upgrade ran again", topic, n, off)
							return nil
						})
						require.NoError(t, err)
						assert.True(t, res.Duplicate)
					}
				}
			}
			ran := false
			res, err := offs.Process(ctx, "billing", &kgo.Record{Topic: "orders", Partition: 0, Offset: next["orders"][0]}, func(context.Context, *sql.Tx) error {
				ran = true
				return nil
			})
			require.NoError(t, err)
			assert.False(t, res.Duplicate)
			assert.True(t, ran, "the next record runs")

			// An instance of the previous release, beside this one.
			r, err := db.ExecContext(ctx, oldAdvance, "billing", "orders", 0, next["orders"][0]+1, next["orders"][0])
			require.NoError(t, err)
			n, err := r.RowsAffected()
			require.NoError(t, err)
			assert.Zero(t, n, "the old instance sees that record done")
			r, err = db.ExecContext(ctx, oldAdvance, "billing", "orders", 0, next["orders"][0]+2, next["orders"][0]+1)
			require.NoError(t, err)
			n, err = r.RowsAffected()
			require.NoError(t, err)
			assert.Equal(t, int64(1), n, "and advances past it on the upgraded table")
			res, err = offs.Process(ctx, "billing", &kgo.Record{Topic: "orders", Partition: 0, Offset: next["orders"][0] + 1}, func(context.Context, *sql.Tx) error {
				t.Error("a record the old instance processed ran again")
				return nil
			})
			require.NoError(t, err)
			assert.True(t, res.Duplicate)
		})
	}
}
