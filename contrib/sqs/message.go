package sqs

import (
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idemhttp/inbox"
)

// newMessage is the handler's view of m, received from queueURL, whose id
// is id, in idSpace, on its receives-th receive (receiveCount). Header
// holds its String message attributes that were received; Raw is the
// [types.Message].
func newMessage(queueURL, idSpace, id string, m *types.Message, receives int) *inbox.Message {
	msg := &inbox.Message{
		ID:          id,
		Source:      queueURL,
		IDSpace:     idSpace,
		Body:        []byte(deref(m.Body)),
		Redelivered: receives > 1,
		Raw:         *m,
	}
	for k, v := range m.MessageAttributes {
		if v.StringValue != nil {
			if msg.Header == nil {
				msg.Header = make(map[string][]string, len(m.MessageAttributes))
			}
			msg.Header[k] = []string{*v.StringValue}
		}
	}
	if ms, err := strconv.ParseInt(m.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
		msg.Time = time.UnixMilli(ms)
	}
	return msg
}
