package ingest

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// KeysFileName is the ingest keys file's name beside the trusted
// reviewers file.
const KeysFileName = "ingest-keys.json"

// keyPrefix starts every ingest key, so one found in a log or a commit is
// recognisable for what it is.
const keyPrefix = "hik_"

// maxKeysFile bounds what the server reads of the keys file.
const maxKeysFile = 4 << 20

// KeyRecord is one ingest key as the keys file keeps it: its public id,
// the tenant its events go to ("" on a server of one Trace root), and the
// SHA-256 of the key — never the key.
type KeyRecord struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	Hash      string `json:"sha256"`
	CreatedAt string `json:"created_at"`
	RevokedAt string `json:"revoked_at,omitempty"`
}

type keysFile struct {
	Version int         `json:"version"`
	Keys    []KeyRecord `json:"keys"`
}

// ErrUnknownKey is a key the file does not list, or lists revoked.
var ErrUnknownKey = errors.New("unknown or revoked ingest key")

// NewKey mints a key for tenant, adds its hash to the keys file at path
// (created 0600 when absent) and returns the key, which nothing keeps.
func NewKey(path, tenant string, now time.Time) (key string, rec KeyRecord, err error) {
	if tenant != "" {
		if err := reviewlog.CheckTenant(tenant); err != nil {
			return "", KeyRecord{}, err
		}
	}
	var id [6]byte
	var secret [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", KeyRecord{}, err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", KeyRecord{}, err
	}
	rec = KeyRecord{ID: hex.EncodeToString(id[:]), Tenant: tenant, CreatedAt: now.UTC().Format(time.RFC3339)}
	key = keyPrefix + rec.ID + "_" + base64.RawURLEncoding.EncodeToString(secret[:])
	rec.Hash = hashKey(key)
	err = updateKeys(path, func(f *keysFile) error {
		f.Keys = append(f.Keys, rec)
		return nil
	})
	return key, rec, err
}

// RevokeKey marks the key id revoked in the keys file at path; a server
// refuses it from its next request on.
func RevokeKey(path, id string, now time.Time) (KeyRecord, error) {
	var out KeyRecord
	err := updateKeys(path, func(f *keysFile) error {
		for i := range f.Keys {
			if f.Keys[i].ID == id {
				if f.Keys[i].RevokedAt != "" {
					return fmt.Errorf("ingest key %s was already revoked at %s", id, f.Keys[i].RevokedAt)
				}
				f.Keys[i].RevokedAt = now.UTC().Format(time.RFC3339)
				out = f.Keys[i]
				return nil
			}
		}
		return fmt.Errorf("%s lists no ingest key %q (ingest-key list shows the ids)", path, clip(id))
	})
	return out, err
}

// ListKeys reads the keys file at path; a missing file lists none.
func ListKeys(path string) ([]KeyRecord, error) {
	f, err := readKeys(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return f.Keys, err
}

func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// keyID is the public id inside a key, "" when key is not shaped like one.
func keyID(key string) string {
	rest, ok := strings.CutPrefix(key, keyPrefix)
	if !ok {
		return ""
	}
	id, secret, ok := strings.Cut(rest, "_")
	if !ok || len(id) != 12 || len(secret) != 43 {
		return ""
	}
	return id
}

func readKeys(path string) (keysFile, error) {
	var f keysFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	if len(b) > maxKeysFile {
		return f, fmt.Errorf("ingest keys file %s is larger than %d bytes", path, maxKeysFile)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("ingest keys file %s: %w", path, err)
	}
	if f.Version != 1 {
		return f, fmt.Errorf("ingest keys file %s: version %d, want 1", path, f.Version)
	}
	return f, nil
}

// updateKeys changes the keys file under an exclusive lock (beside it) and
// writes it whole: a new file, synced, renamed into place, the directory
// synced.
func updateKeys(path string, change func(*keysFile) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "."+filepath.Base(path)+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("lock the ingest keys file: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock the ingest keys file: %w", err)
	}
	f, err := readKeys(path)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = keysFile{Version: 1}, nil
	}
	if err != nil {
		return err
	}
	if err := change(&f); err != nil {
		return err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write the ingest keys file: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.Write(append(b, '\n'))
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write the ingest keys file %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// Keys is the server's view of the keys file: re-read when it changes on
// disk (so a revocation holds from the next request), kept otherwise.
type Keys struct {
	path string

	mu    sync.Mutex
	stamp fileStamp
	byID  map[string]KeyRecord
}

type fileStamp struct {
	ino, size int64
	mtime     time.Time
}

// OpenKeys reads the keys file at path. A missing file is an error: a
// server with --ingest and no key would refuse every recorder.
func OpenKeys(path string) (*Keys, error) {
	k := &Keys{path: path}
	if err := k.refresh(); err != nil {
		return nil, err
	}
	return k, nil
}

// Path is the keys file's path.
func (k *Keys) Path() string { return k.path }

func (k *Keys) refresh() error {
	st, err := os.Stat(k.path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("no ingest keys file at %s: create a key with `haia-trace-mcp ingest-key create`", k.path)
		}
		return err
	}
	stamp := fileStamp{size: st.Size(), mtime: st.ModTime()}
	if sys, ok := st.Sys().(*unix.Stat_t); ok {
		stamp.ino = int64(sys.Ino)
	}
	if stamp == k.stamp && k.byID != nil {
		return nil
	}
	f, err := readKeys(k.path)
	if err != nil {
		return err
	}
	byID := make(map[string]KeyRecord, len(f.Keys))
	for _, r := range f.Keys {
		byID[r.ID] = r
	}
	k.stamp, k.byID = stamp, byID
	return nil
}

// Lookup finds the record of key. A key the file does not list, lists
// revoked, or whose hash does not match is ErrUnknownKey; a keys file that
// cannot be read is its own error, and no key is accepted meanwhile: the
// keys read before may include one revoked by the very change that broke
// the file (the recorder is answered 503 and retries).
func (k *Keys) Lookup(key string) (KeyRecord, error) {
	k.mu.Lock()
	err := k.refresh()
	byID := k.byID
	k.mu.Unlock()
	if err != nil {
		return KeyRecord{}, err
	}
	id := keyID(key)
	rec, ok := byID[id]
	if id == "" || !ok || rec.RevokedAt != "" {
		return KeyRecord{}, ErrUnknownKey
	}
	if subtle.ConstantTimeCompare([]byte(hashKey(key)), []byte(rec.Hash)) != 1 {
		return KeyRecord{}, ErrUnknownKey
	}
	return rec, nil
}
