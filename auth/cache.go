package auth

import (
	"slices"
	"sync"
	"time"
)

// tokenCache remembers identities of tokens that passed full verification.
// It belongs to one keySet, so a Reload starts with an empty cache and a
// token of a removed key stops working at once.
type tokenCache struct {
	mu      sync.Mutex
	max     int
	entries map[[32]byte]cacheEntry
}

type cacheEntry struct {
	id       Identity
	verified time.Time // clock reading when the token was fully verified
}

func newTokenCache(max int) *tokenCache {
	if max <= 0 {
		return nil // caching off
	}
	return &tokenCache{max: max, entries: make(map[[32]byte]cacheEntry)}
}

// get returns the identity of a remembered token that is still inside its
// lifetime. nbf and iat held when it was verified; a clock that moved
// backwards since then forces a full check again.
func (c *tokenCache) get(key [32]byte, now time.Time, leeway time.Duration) (Identity, bool) {
	if c == nil {
		return Identity{}, false
	}
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && (now.Before(e.verified) || !now.Truncate(time.Second).Before(e.id.ExpiresAt.Add(leeway))) {
		delete(c.entries, key)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return Identity{}, false
	}
	id := e.id
	id.Scopes = slices.Clone(id.Scopes) // callers may keep or change their copy
	return id, true
}

func (c *tokenCache) put(key [32]byte, id Identity, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		// Evict expired entries first; if none, drop an arbitrary one.
		for k, e := range c.entries {
			if !now.Before(e.id.ExpiresAt) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < c.max {
				break
			}
			delete(c.entries, k)
		}
	}
	id.Scopes = slices.Clone(id.Scopes)
	c.entries[key] = cacheEntry{id: id, verified: now}
}
