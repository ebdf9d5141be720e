package sqs_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sqsinbox "github.com/idemkit/idemhttp/contrib/sqs"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/testenv"
)

// newSchema creates a PostgreSQL schema private to the test (dropped when
// it ends) with an effects table and the inbox, and returns a pool on it.
// It skips the test when no server is configured (fails on CI).
func newSchema(t testing.TB) *sql.DB {
	t.Helper()
	db, _ := testenv.EffectsDB(t, "d2_sqs_")
	require.NoError(t, (&inbox.SQL{DB: db}).Migrate(context.Background()))
	return db
}

// Every message is sent twice by its producer (a retry after a lost
// SendMessage response: SQS gives the copies different MessageIds, the
// producer's idem-id attribute is the same), a fifth of the deletes after
// a commit are lost (as in a crash before the delete), and lost messages
// come back when their visibility ends. Through the inbox, keyed by the
// producer's id, every order's effect happens once; a naive consumer
// (effect committed alone, no inbox) shows the duplicates, which is the
// check that the test can fail. Against the fake, not SQS: see the
// package documentation.
func TestLostDeletesAndProducerRetries(t *testing.T) {
	const orders = 300
	for _, mode := range []string{"inbox", "naive"} {
		t.Run(mode, func(t *testing.T) {
			db := newSchema(t)
			f := newFake()
			rng := rand.New(rand.NewPCG(1, 2))
			var mu sync.Mutex
			f.failDelete = func() bool { mu.Lock(); defer mu.Unlock(); return rng.IntN(5) == 0 }
			for i := range orders {
				attr := map[string]types.MessageAttributeValue{
					"idem-id": {DataType: aws.String("String"), StringValue: aws.String(fmt.Sprintf("order-%d", i))},
				}
				f.send("order", attr, nil)
				f.send("order", attr, nil)
			}
			h := testenv.EffectHandler(mode, db, "d2-sqs")
			c := &sqsinbox.Consumer{QueueURL: queueURL, IDAttribute: "idem-id"}
			rounds := 0
			for {
				n, _ := f.live()
				if n == 0 {
					break
				}
				require.Less(t, rounds, 100, "no progress")
				require.NoError(t, runUntilIdle(c, f, h))
				f.expire() // the lost deletes' messages come back
				rounds++
			}
			rows, distinct := testenv.Effects(t, db)
			t.Logf("%s: %d effect rows for %d orders (%d messages), %d rounds", mode, rows, orders, 2*orders, rounds)
			assert.Equal(t, orders, distinct)
			if mode == "inbox" {
				assert.Equal(t, orders, rows, "no effect ran twice")
			} else {
				assert.Greater(t, rows, orders, "the naive consumer ran effects twice")
			}
		})
	}
}
