//go:build !idemhttp_nosync

package wal

// syncDisabled is the one switch every sync path of the log consults
// (the O_DSYNC flag, SyncData, the directory sync, WriteBack), whatever
// its FS. Only the idemhttp_nosync build tag sets it, for the power-loss
// test's control run, which must show that a build without syncs loses
// acknowledged entries.
const syncDisabled = false
