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
// With DeduplicationID, an id that is the SHA-256 of the body is refused
// ([ErrContentBasedID]): that is what a FIFO queue with content-based
// deduplication makes when the producer sets no id, and two different
// messages with the same body (two equal payments) would share it.
//
// A message with no id (or a refused one) is never handled and never
// deleted: it is hidden for the retry delay and, after the queue's
// maxReceiveCount receives, moved to its dead-letter queue by the redrive
// policy, and reported ([NoIDRedrive], the default), or made visible again
// while Run stops with an error naming the queue ([NoIDStop]).
//
// Each message's [inbox.Message.IDSpace] is its queue's URL (or
// [Consumer.IDSpace]), so an inbox shared by the consumers of two queues
// never takes one queue's message for a duplicate of the other's.
//
// # Delete after commit
//
// Run deletes a message only after the handler returned nil, which for an
// inbox handler means after its transaction committed. A crash before the
// delete leaves the message in the queue, and it is received again when
// its visibility timeout ends, by this consumer or another.
//
// # The message core and its ledger
//
// Every message goes through the message core of the inbox package
// ([inbox.Runner], see docs/consumer.md): it decides delete and the
// visibility of a message handed back from evidence and from the inbox's
// own record of the message's handler runs, [Consumer.Ledger]; Run maps
// each decision onto SQS's verbs. Give it the ledger of the handler's
// inbox (in.Ledger("order-recorder")). One rule is SQS's and not the
// core's: the redrive policy dead-letters a message by SQS's own receive
// count, which every receive raises, handled or not (see below).
//
// # Shutdown and maxReceiveCount
//
// Cancelling Run's context loses nothing, whatever the settings: a message
// whose handler is running is deleted if the handler returns nil (its
// effect committed) and made visible again at once otherwise; the
// messages received and not yet handled are made visible at once too.
// A receive in progress is not cancelled: SQS would go on with the long
// poll whose client left, and the messages it then received would stay
// hidden for the visibility timeout, unseen; Run waits for it instead
// ([Consumer.WaitTime] at most: keep it under your shutdown's grace
// period) and makes what it brought visible at once.
//
// What a shutdown costs: SQS counts every receive toward the redrive
// policy's maxReceiveCount, and the core cannot make it count less. Each
// shutdown costs each message it touches (the one whose handler it
// interrupted, those received with it, those a receive in progress
// brought) exactly one receive, and no more; so does a release at the
// processing limit. A healthy message that meets maxReceiveCount
// shutdowns is dead-lettered by SQS, unrun. Set maxReceiveCount to
// Retry.MaxDeliveries plus the shutdowns (deploys, scale-downs) a message
// may meet while it waits, with room to spare: 10 or more.
//
// # Poison messages
//
// A handler error rolls its transaction back, the inbox row with it; the
// ledger counts the failure, and Run hides the message for a delay that
// doubles with each counted failure ([Consumer.Retry]: 1 s to 5 min by
// default), so nothing spins. The queue's redrive policy moves it to the
// dead-letter queue after maxReceiveCount receives; Run reports it,
// through [Consumer.OnDeadLetter] and a log line at level Error, on the
// receive that was its last. Run refuses to consume a queue without a
// redrive policy ([ErrNoRedrivePolicy]): there, SQS would delete a poison
// message, silently, when its retention period ends.
// [Consumer.NoRedrivePolicy] allows it, and Run then reports such a
// message at every failure from [inbox.Retry.MaxDeliveries] on. Run reads
// the policy with GetQueueAttributes, which needs the
// sqs:GetQueueAttributes permission. A message that kills its consumer's
// process is received again after its visibility timeout, and dead-
// lettered by the redrive policy like any other.
//
// # Visibility, slow handlers and hung handlers
//
// While a handler runs, Run extends its message's visibility timeout every
// third of [Consumer.VisibilityTimeout], so another consumer does not
// receive it meanwhile. Should that fail (a long network partition), the
// second consumer's transaction waits on the first's inbox row and then
// runs nothing, and the first's delete fails harmlessly
// ([Consumer.OnSettleError] hears of it). A handler runs for at most
// [Consumer.ProcessingLimit] (5 minutes by default): then its context ends,
// which rolls an inbox transaction back (see [inbox.SQL]: the server's own
// timeouts end it even if the handler ignores its context), the extensions
// stop, the ledger counts a failure, and Run makes the message visible at
// once, for another consumer, and so the messages received behind it,
// which are not held until their visibility ends. Run waits for the
// handler to return and never deletes the message it released.
//
// # Across an upgrade
//
// The inbox's rows written by the previous release stay duplicates, and
// an instance of the previous release running beside this one during a
// rolling deploy agrees with it on every message id (see Formats and
// upgrades in the inbox package). The previous release grew the retry
// delays with the receive count; this one grows them with the ledger's
// count of failures, from the upgrade on.
//
// # Inbox retention
//
// SQS keeps a message at most 14 days (MessageRetentionPeriod) and hides it
// at most 12 hours, so an inbox id older than 15 days
// ([inbox.DefaultMinRetention], the floor of [inbox.SQL.Prune]) can no
// longer be redelivered by SQS; keep ids longer if producers may resend
// later than that.
//
// # Tested against a fake
//
// This package is tested against an in-memory fake of [API] that models
// receipt handles, visibility, receive counts and the redrive policy (once
// through the real SDK client, with
// the fake behind SQS's JSON protocol), not against SQS. No local SQS
// implementation could be run in this project's CI: ElasticMQ needs a JVM,
// and goaws (v0.4.5, the version available) speaks only SQS's old query
// protocol, while aws-sdk-go-v2's SQS client speaks only the JSON
// protocol. Run it against a real queue before relying on it.
package sqs
