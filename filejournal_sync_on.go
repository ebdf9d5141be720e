//go:build !idemhttp_nosync

package idemhttp

// fjSyncDisabled is the one switch for the FileJournal's syncs, consulted
// by fjSyncFlag, fjDatasync and fjSyncDir. It is true only in a build with
// the idemhttp_nosync tag (filejournal_sync_off.go), which exists so the
// power-loss test can show that it catches a journal that does not sync.
const fjSyncDisabled = false
