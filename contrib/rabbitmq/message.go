package rabbitmq

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idemhttp/inbox"
)

// newMessage is the handler's view of delivery d, whose id is id.
func newMessage(id string, d *amqp.Delivery) *inbox.Message {
	return &inbox.Message{ID: id, Body: d.Body}
}
