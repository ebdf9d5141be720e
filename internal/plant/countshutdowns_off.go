//go:build !idemhttp_bug_countshutdowns

package plant

// CountShutdowns, with the idemhttp_bug_countshutdowns build tag: the message core counts a handler's error during a shutdown as the handler's failure, so that shutdowns' requeues spend a message's budget (the bug of issue 30 §3.9; internal/msgsim must find it).
const CountShutdowns = false
