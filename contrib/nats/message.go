package nats

import (
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idemhttp/inbox"
)

// newMessage is the handler's view of msg, whose id is id and whose
// metadata is md (nil when msg.Metadata failed). Its IDSpace is idSpace, or
// the stream's name when idSpace is empty. Raw is the [jetstream.Msg].
func newMessage(id, idSpace string, msg jetstream.Msg, md *jetstream.MsgMetadata) *inbox.Message {
	m := &inbox.Message{
		ID:      id,
		Source:  msg.Subject(),
		IDSpace: idSpace,
		Body:    msg.Data(),
		Header:  msg.Headers(),
		Raw:     msg,
	}
	if md != nil {
		m.Source = md.Stream + "/" + msg.Subject()
		m.Time = md.Timestamp
		m.Redelivered = md.NumDelivered > 1
		if m.IDSpace == "" {
			m.IDSpace = md.Stream
		}
	}
	return m
}
