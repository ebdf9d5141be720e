package nats

import (
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idemhttp/inbox"
)

// newMessage is the handler's view of msg, whose id is id.
func newMessage(id string, msg jetstream.Msg) *inbox.Message {
	return &inbox.Message{ID: id, Body: msg.Data()}
}
