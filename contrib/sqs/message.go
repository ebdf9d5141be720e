package sqs

import (
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idemhttp/inbox"
)

// newMessage is the handler's view of m, whose id is id.
func newMessage(id string, m *types.Message) *inbox.Message {
	return &inbox.Message{ID: id, Body: []byte(deref(m.Body))}
}
