package rabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idemhttp/inbox"
)

// newMessage is the handler's view of delivery d, whose id is id, in
// idSpace. Header holds the AMQP headers whose values are strings or
// bytes, each as one value; the rest, and the other properties, are in
// Raw (the [amqp.Delivery]).
func newMessage(queue, idSpace, id string, d *amqp.Delivery) *inbox.Message {
	m := &inbox.Message{
		ID:          id,
		Source:      queue,
		IDSpace:     idSpace,
		Body:        d.Body,
		Time:        d.Timestamp,
		Redelivered: d.Redelivered,
		Raw:         *d,
	}
	for k, v := range d.Headers {
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		case fmt.Stringer:
			s = v.String()
		default:
			continue
		}
		if m.Header == nil {
			m.Header = make(map[string][]string, len(d.Headers))
		}
		m.Header[k] = []string{s}
	}
	return m
}
