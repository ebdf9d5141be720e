package postgres

// SetTxStepHook makes m call at at each step of a request ("handler",
// "before-commit", "after-commit", "mid-response"), for crash tests.
func SetTxStepHook(m *TxMiddleware, at func(step string)) { m.at = at }

// RowKey exposes rowKey to the tests.
func RowKey(key string) []byte { return rowKey(key) }

// ScopedRowKey exposes scopedRowKey to the tests.
func ScopedRowKey(scope, key string) []byte { return scopedRowKey(scope, key) }
