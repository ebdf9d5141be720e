//go:build idemhttp_nosync

package idemhttp

// fjSyncDisabled: this build (tag idemhttp_nosync) never syncs the
// journal: no O_DSYNC, no fdatasync or F_FULLFSYNC, no directory sync.
// Such a journal loses acknowledged entries when the power fails; it is
// the control of TestPowerCut, and must never be shipped.
const fjSyncDisabled = true
