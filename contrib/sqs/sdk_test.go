package sqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sqsinbox "github.com/idemkit/idemhttp/contrib/sqs"
	"github.com/idemkit/idemhttp/inbox"
)

// serveJSON puts the fake behind SQS's JSON protocol (the one aws-sdk-go-v2
// speaks: POST /, X-Amz-Target: AmazonSQS.<Operation>, JSON bodies), on a
// loopback port, so that a test can drive the consumer through the real
// SDK client: its serialisation of the consumer's requests, and its
// parsing of the answers. The protocol framing is the SDK's; the queue
// semantics are still the fake's.
func serveJSON(t *testing.T, f *fakeSQS) *sqs.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op, ok := strings.CutPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
		if !ok || r.Method != http.MethodPost {
			http.Error(w, "not an SQS JSON request", http.StatusBadRequest)
			return
		}
		var out any
		var err error
		dec := json.NewDecoder(r.Body)
		switch op {
		case "ReceiveMessage":
			var in sqs.ReceiveMessageInput
			if err = dec.Decode(&in); err == nil {
				out, err = f.ReceiveMessage(r.Context(), &in)
			}
		case "DeleteMessage":
			var in sqs.DeleteMessageInput
			if err = dec.Decode(&in); err == nil {
				out, err = f.DeleteMessage(r.Context(), &in)
			}
		case "GetQueueAttributes":
			var in sqs.GetQueueAttributesInput
			if err = dec.Decode(&in); err == nil {
				out, err = f.GetQueueAttributes(r.Context(), &in)
			}
		case "ChangeMessageVisibility":
			var in sqs.ChangeMessageVisibilityInput
			if err = dec.Decode(&in); err == nil {
				out, err = f.ChangeMessageVisibility(r.Context(), &in)
			}
		default:
			err = errors.New("unsupported operation " + op)
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		if err != nil {
			code := "InvalidParameterValue"
			var rh *types.ReceiptHandleIsInvalid
			if errors.As(err, &rh) {
				code = "ReceiptHandleIsInvalid"
			}
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + code, "message": err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  aws.AnonymousCredentials{},
		HTTPClient:   &http.Client{Transport: tr},
		// The fake computes no MD5 digests of bodies and attributes.
		DisableMessageChecksumValidation: true,
		RetryMaxAttempts:                 1,
	})
}

// The consumer through the real SDK client: the id attribute it asks for
// comes back, a handler error makes the message visible again, and the
// deletes carry the receipt handles the receives gave.
func TestRunThroughSDK(t *testing.T) {
	f := newFake()
	client := serveJSON(t, f)
	for _, order := range []string{"order-1", "order-2"} {
		f.send("body of "+order, map[string]types.MessageAttributeValue{
			"idem-id": {DataType: aws.String("String"), StringValue: aws.String(order)},
			"tenant":  {DataType: aws.String("String"), StringValue: aws.String("acme")},
		}, nil)
	}
	f.send("no id", nil, nil)

	var seen []string
	var bodies []string
	h := func(_ context.Context, m *inbox.Message) error {
		seen = append(seen, m.ID)
		bodies = append(bodies, string(m.Body))
		assert.Equal(t, []string{"acme"}, m.Header["tenant"])
		if len(seen) == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	}
	var settle []error
	c := &sqsinbox.Consumer{
		QueueURL:      queueURL,
		IDAttribute:   "idem-id",
		WaitTime:      time.Second, // the shutdown waits for the receive in progress
		OnSettleError: func(_ string, err error) { settle = append(settle, err) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx, client, h) }()
	<-f.received // the queue is empty but for the hidden messages
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	f.expire() // order-1's retry delay ends
	require.NoError(t, runUntilIdleVia(c, f, client, h))

	assert.Equal(t, []string{"order-1", "order-2", "order-1"}, seen, "order-1 hidden for its delay, received again")
	assert.Equal(t, "body of order-1", bodies[0])
	assert.Empty(t, settle, "every delete and visibility change was accepted")
	n, hidden := f.live()
	assert.Equal(t, 1, n, "only the message with no id is left")
	assert.Equal(t, 1, hidden)
}
