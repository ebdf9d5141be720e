package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	"github.com/idemkit/idemhttp"
)

// defaultSecretEnv is the environment variable batch reads the key secret
// from unless -key-secret-env names another.
const defaultSecretEnv = "IDEMCTL_KEY_SECRET"

// keyFileSuffix names the default key file: beside the journal, so the two
// are found, backed up and moved together.
const keyFileSuffix = ".key"

// keyFlags are batch's settings for choosing keys.
type keyFlags struct {
	secretEnv    string
	secretEnvSet bool // -key-secret-env given on the command line
	keyFile      string
	keyFileSet   bool
	random       bool   // -random-keys
	createdFile  string // the key file this run created, if any
}

// secret returns the secret that derives every key, or nil with
// -random-keys. In order: the environment variable (-key-secret-env,
// IDEMCTL_KEY_SECRET by default); else the key file (-key-file,
// JOURNAL.key by default). When the key file does not exist yet, secret
// returns no secret and its path in create, and touches nothing: the
// caller creates it (createSecret) once the journal has been found
// sound, so that a -journal naming the wrong file leaves no key file
// beside it.
//
// Random keys are the one choice that makes a lost journal (or a pruned
// entry) a duplicate: the rerun mints a new key for an operation the
// server already ran. So they are refused unless asked for by name.
// Errors never show the secret, only where it came from.
func (k *keyFlags) secret(journal string, getenv func(string) string) (secret []byte, create string, err error) {
	if k.random {
		if k.secretEnvSet || k.keyFileSet {
			return nil, "", fail(exitUsage, "-random-keys cannot be combined with -key-secret-env or -key-file")
		}
		return nil, "", nil
	}
	if v := getenv(k.secretEnv); v != "" {
		// DeriveKey refuses short secrets; find out now, not per line.
		if _, err := idemhttp.DeriveKey([]byte(v), "check"); err != nil {
			return nil, "", fail(exitUsage, "the key secret in environment variable %s is too short: at least 16 bytes are needed", k.secretEnv)
		}
		return []byte(v), "", nil
	}
	if k.secretEnvSet {
		return nil, "", fail(exitUsage, "-key-secret-env: environment variable %s is empty or unset", k.secretEnv)
	}
	path := k.keyFile
	if path == "" {
		path = journal + keyFileSuffix
	}
	s, err := readKeyFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, path, nil
	}
	return s, "", err
}

// createSecret creates the key file at path that secret found missing
// (or reads the one another process created meanwhile) and returns its
// secret.
func (k *keyFlags) createSecret(path string) ([]byte, error) {
	s, created, err := loadOrCreateKeyFile(path)
	if err != nil {
		return nil, err
	}
	if created {
		k.createdFile = path
	}
	return s, nil
}

// loadOrCreateKeyFile reads the secret in path, creating the file with a
// new random secret when it does not exist. The new file appears whole or
// not at all (written and synced under a temporary name, then linked into
// place, which fails if another process got there first), so two batches
// starting at once agree on one secret.
func loadOrCreateKeyFile(path string) (secret []byte, created bool, err error) {
	s, err := readKeyFile(path)
	if err == nil {
		return s, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, false, fail(exitJournal, "key file %s: %v", path, err)
	}
	content := []byte(hex.EncodeToString(raw[:]) + "\n")
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, false, fail(exitJournal, "create key file %s: %v", path, err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600: it is never readable by others,
	// even for the moment before it is complete.
	_, werr := tmp.Write(content)
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return nil, false, fail(exitJournal, "create key file %s: %v", path, werr)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			// Another process created it first: use its secret.
			s, err := readKeyFile(path)
			return s, false, err
		}
		return nil, false, fail(exitJournal, "create key file %s: %v", path, err)
	}
	if err := syncDir(dir); err != nil {
		return nil, false, fail(exitJournal, "create key file %s: sync directory: %v", path, err)
	}
	return bytes.TrimSpace(content), true, nil
}

// readKeyFile reads a key file: its content, surrounding white space
// trimmed, is the secret. A file others may read is refused: the secret
// lets anyone predict every key.
func readKeyFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fail(exitJournal, "key file %s: %v", path, err)
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		return nil, fail(exitJournal, "key file %s is readable or writable by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fail(exitJournal, "key file %s: %v", path, err)
	}
	s := bytes.TrimSpace(b)
	if _, err := idemhttp.DeriveKey(s, "check"); err != nil {
		return nil, fail(exitJournal, "key file %s holds %d bytes: at least 16 are needed", path, len(s))
	}
	return s, nil
}
