// Package sqs consumes Amazon SQS queues (through
// github.com/aws/aws-sdk-go-v2/service/sqs) into an [inbox.Handler], so
// that every message's effect happens once even though SQS delivers at
// least once.
//
// It lives in its own module so that idemhttp's core does not depend on
// the AWS SDK. Its name is the same as the SDK's package, so import it
// under another name:
//
//	import sqsinbox "github.com/idemkit/idemhttp/contrib/sqs"
//
//	client := sqs.NewFromConfig(cfg)
//	c := &sqsinbox.Consumer{QueueURL: url, IDAttribute: "idem-id"}
//	err := c.Run(ctx, client, handle)
//
// # Where the message id comes from
//
// SQS's MessageId by default: assigned by SQS when it accepts a
// SendMessage, and the same on every redelivery of that message, so it
// dedups redeliveries. It cannot dedup a producer's own retry: a producer
// that sends again because the first SendMessage timed out creates a
// second message with a new MessageId. For that the producer assigns the
// id: a String message attribute ([Consumer.IDAttribute]) set to the
// business operation's id, or, on a FIFO queue, the MessageDeduplicationId
// ([Consumer.DeduplicationID]), which SQS also uses to drop a second send
// within its 5-minute deduplication interval (the inbox covers the
// retries that come later).
//
// A message with no id is never handled and never deleted: it is left to
// come back and, after the queue's maxReceiveCount, to be moved to its
// dead-letter queue by the redrive policy ([NoIDRedrive], the default), or
// made visible again while Run stops ([NoIDStop]).
//
// # Delete after commit, redeliver on error
//
// Run deletes a message only after the handler returned nil, which for an
// inbox handler means after its transaction committed. A crash before the
// delete leaves the message in the queue, and it is received again when
// its visibility timeout ends, by this consumer or another. A handler
// error makes the message visible again after [Consumer.RetryDelay]; its
// transaction rolled back, the inbox row with it, so the next receive
// runs the effect again.
//
// # Visibility and slow handlers
//
// While a handler runs, Run extends its message's visibility timeout every
// third of [Consumer.VisibilityTimeout], so another consumer does not
// receive it meanwhile. Should that fail (a long network partition), the
// second consumer's transaction waits on the first's inbox row and then
// runs nothing, and the first's delete fails harmlessly
// ([Consumer.OnSettleError] hears of it).
//
// # Tested against a fake
//
// This package is tested against an in-memory fake of [API] that models
// receipt handles and visibility (once through the real SDK client, with
// the fake behind SQS's JSON protocol), not against SQS. No local SQS
// implementation could be run in this project's CI: ElasticMQ needs a JVM,
// and goaws (v0.4.5, the version available) speaks only SQS's old query
// protocol, while aws-sdk-go-v2's SQS client speaks only the JSON
// protocol. Run it against a real queue before relying on it.
package sqs
