package testenv

import (
	"context"
	"fmt"
	"os"

	"github.com/idemkit/idemhttp/inbox"
)

// DieAfter returns h made to SIGKILL the process (see [Die]) right after
// its n-th success: the effect committed, the message not acked, the
// worst moment for a consumer to die. It is for a child process's single
// consumer goroutine; n <= 0 means never.
func DieAfter(n int, h inbox.Handler) inbox.Handler {
	done := 0
	return func(ctx context.Context, m *inbox.Message) error {
		if err := h(ctx, m); err != nil {
			return err
		}
		if done++; done == n {
			Die()
		}
		return nil
	}
}

// ChildFailed prints a child process's error to stderr and returns the
// status to exit with, 1.
func ChildFailed(err error) int {
	fmt.Fprintln(os.Stderr, "child:", err)
	return 1
}
