package postgres

// SetTxStepHook makes m call at at each step of a request ("handler",
// "before-commit", "after-commit", "mid-response"), for crash tests.
func SetTxStepHook(m *TxMiddleware, at func(step string)) { m.at = at }

// RowKey exposes rowKey to the tests.
func RowKey(key string) []byte { return rowKey(key) }

// IgnoreTxReport makes m ignore the server's report of the end of a
// request's transaction (default_transaction_read_only's ParameterStatus),
// as when an older server or a pooler does not send it, so that a test can
// check the statement that asks instead.
func IgnoreTxReport(m *TxMiddleware) { m.noReport = true }
