//go:build !idemhttp_bug_dropspace

package plant

// DropSpace, with the idemhttp_bug_dropspace build tag: inbox.SQL's
// Handle records every message under the consumer's plain name, its id
// space (Message.IDSpace) dropped from the stored key, so that two queues'
// messages with one id are taken for one: the second is acked as a
// duplicate, never run (internal/msgsim must find it).
const DropSpace = false
