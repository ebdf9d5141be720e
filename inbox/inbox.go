package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idemhttp"
)

// Message is one delivery of a message, in the form every broker adapter
// hands to a [Handler]. The adapter owns the message: a Handler must not
// keep it, or its Body, after it returns.
type Message struct {
	// ID identifies the logical message: the same on every delivery of it,
	// and different for every other message. Adapters fill it from the
	// source they are configured with (a producer-assigned header, or the
	// broker's own id); see the package documentation. Empty means the
	// message has none, and [SQL.Handle] refuses it with [ErrNoMessageID].
	ID string

	// Source names where the message came from: a Kafka topic and
	// partition, a queue, a subject. For logs.
	Source string

	// IDSpace names the space in which ID is unique: the queue (RabbitMQ,
	// SQS), the stream (NATS JetStream) or the topic (Kafka) the message
	// came from, unless the adapter was told that several sources share
	// one id space (their IDSpace setting). [SQL.Handle] records ids per
	// consumer and id space, so two queues whose ids overlap never make a
	// message look like a duplicate of the other queue's. Empty means one
	// id space for everything the consumer handles.
	IDSpace string

	// Body is the message's payload.
	Body []byte

	// Header holds the message's headers or properties, as the broker
	// gives them; nil when it has none.
	Header map[string][]string

	// Time is when the broker (or producer) stamped the message; zero when
	// unknown.
	Time time.Time

	// Redelivered is true when the broker says it delivered this message
	// before. False says nothing: brokers cannot always tell.
	Redelivered bool

	// Raw is the broker client's own message (*kgo.Record,
	// amqp091.Delivery, ...), for what Message does not carry.
	Raw any
}

// Handler processes one message. An adapter acks the message (or commits
// its offset) only after Handler returns nil, and leaves it to be
// redelivered when Handler returns an error. A duplicate that the inbox
// skipped is a success: the Handler returns nil, and the message is acked.
type Handler func(ctx context.Context, m *Message) error

// Result tells what [SQL.Process] did with a message.
type Result struct {
	// Duplicate is true when the message id had already been processed (its
	// transaction committed before), so nothing ran.
	Duplicate bool
}

var (
	// ErrNoMessageID: the message has no id, so it cannot be deduplicated
	// and nothing ran. Adapters leave such a message unacked unless
	// configured to dead-letter it.
	ErrNoMessageID = errors.New("inbox: message has no id")

	// ErrInvalidConsumer: the consumer name is empty, longer than
	// [MaxIDLen] bytes, not valid UTF-8, or holds a control character
	// (NUL, tab, U+001F, ...).
	ErrInvalidConsumer = errors.New("inbox: invalid consumer name")

	// ErrInvalidTable: a table name is not a plain SQL identifier.
	ErrInvalidTable = errors.New("inbox: invalid table name")
)

// MaxIDLen is the longest message id stored as it is, in bytes. Longer ids
// are stored hashed (see [StoredID]), so the table's primary key stays small
// and within every engine's index limits (PostgreSQL's B-tree refuses
// entries over about 2.7 kB).
const MaxIDLen = 200

// hashedPrefix starts every hashed id. A raw id that starts with it is
// hashed too, so a stored raw id can never equal another id's hash.
const hashedPrefix = "sha256:"

// StoredID returns the form in which the inbox stores the message id id:
// id itself when it is at most [MaxIDLen] bytes of valid UTF-8 without NUL
// bytes (which PostgreSQL's text cannot hold) and does not start with
// "sha256:"; otherwise "sha256:" followed by the 64 lowercase hex digits of
// the SHA-256 of id. The mapping is one-to-one up to SHA-256 collisions, so
// two different ids are never merged. It does not check for an empty id.
func StoredID(id string) string {
	if len(id) <= MaxIDLen && utf8.ValidString(id) && strings.IndexByte(id, 0) < 0 && !strings.HasPrefix(id, hashedPrefix) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return hashedPrefix + hex.EncodeToString(sum[:])
}

func checkConsumer(consumer string) error {
	if consumer == "" || len(consumer) > MaxIDLen || !utf8.ValidString(consumer) || strings.ContainsFunc(consumer, unicode.IsControl) {
		return fmt.Errorf("%w: %q", ErrInvalidConsumer, consumer)
	}
	return nil
}

// spaceSeparator joins a consumer name and an id space in the consumer
// column. It is a control character, which consumer names may not hold,
// so the stored form is one-to-one.
const spaceSeparator = "\x1f"

// StoredConsumer returns the value of the inbox table's consumer column
// under which [SQL.Handle] records the messages of idSpace (see
// [Message.IDSpace]) that consumer processes: consumer itself when idSpace
// is empty, else consumer, the unit separator U+001F, and
// [StoredID](idSpace). It is one-to-one, so two id spaces never share
// rows. A consumer name that is empty, longer than [MaxIDLen] bytes, not
// valid UTF-8 or holding a control character gives [ErrInvalidConsumer].
func StoredConsumer(consumer, idSpace string) (string, error) {
	if err := checkConsumer(consumer); err != nil {
		return "", err
	}
	if idSpace == "" {
		return consumer, nil
	}
	return consumer + spaceSeparator + StoredID(idSpace), nil
}

// DeriveKey returns the idempotency key for the HTTP call that consumer
// makes for the message messageID: [idemhttp.DeriveKey] of secret and the
// operation "inbox:" + len(consumer) + ":" + consumer + ":" + messageID
// (the length keeps "a:b" + "c" apart from "a" + "b:c"). Every delivery of
// the message derives the same key, so a consumer whose effect is a call to
// an idempotent API (Stripe, or a server behind idemserver) needs no inbox
// table: send the call through an [idemhttp.Client] with
// [idemhttp.WithKey], ack after it succeeds, and a redelivery is replayed
// by the server. The server must keep keys for longer than the broker may
// redeliver.
//
// For a [Message] from an adapter, use [DeriveMessageKey], which keeps the
// message's id space apart from others.
//
// An empty messageID gives [ErrNoMessageID]; an invalid consumer
// [ErrInvalidConsumer]; a secret under 16 bytes an error wrapping
// [idemhttp.ErrInvalidKey].
func DeriveKey(secret []byte, consumer, messageID string) (string, error) {
	if err := checkConsumer(consumer); err != nil {
		return "", err
	}
	return deriveKey(secret, consumer, messageID)
}

func deriveKey(secret []byte, consumer, messageID string) (string, error) {
	if messageID == "" {
		return "", ErrNoMessageID
	}
	return idemhttp.DeriveKey(secret, "inbox:"+strconv.Itoa(len(consumer))+":"+consumer+":"+messageID)
}

// DeriveMessageKey is [DeriveKey] for the message m, scoped by its id
// space as [SQL.Handle] scopes its rows: the key of
// [StoredConsumer](consumer, m.IDSpace) and m.ID. Two queues whose ids
// overlap get different keys, unless their adapters declare one shared id
// space; a message with no id space gets DeriveKey's key. A consumer that
// switches from DeriveKey to DeriveMessageKey changes the keys of its
// messages with an id space: a redelivery of a message whose call was
// made under the old key then runs it again at the server, so switch
// only when no such message can come back within the server's key
// retention.
func DeriveMessageKey(secret []byte, consumer string, m *Message) (string, error) {
	c, err := StoredConsumer(consumer, m.IDSpace)
	if err != nil {
		return "", err
	}
	return deriveKey(secret, c, m.ID)
}
