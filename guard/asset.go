package guard

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Asset is a token the guard can do money math in. Key is the CAIP-2 network
// and the token address joined by "/" ("eip155:8453/0x8335…2913"); EVM
// addresses are kept in lower case so that keys compare as strings.
type Asset struct {
	Key      string `json:"key"`
	Network  string `json:"network"`
	Address  string `json:"address"`
	Symbol   string `json:"symbol"`
	Decimals int    `json:"decimals"`
}

// The two USDC deployments every policy knows without configuration.
const (
	USDCBase        = "eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"
	USDCBaseSepolia = "eip155:84532/0x036cbd53842c5426634e7929541ec2318f3dcf7e"
)

func builtinAssets() []Asset {
	return []Asset{
		{Key: USDCBase, Network: "eip155:8453", Address: "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913", Symbol: "USDC", Decimals: 6},
		{Key: USDCBaseSepolia, Network: "eip155:84532", Address: "0x036cbd53842c5426634e7929541ec2318f3dcf7e", Symbol: "USDC", Decimals: 6},
	}
}

// BuiltinAsset is one of the assets every policy knows, by registry key:
// what an offline reader (a dossier's verifier) can name without the
// server's policy.
func BuiltinAsset(key string) (Asset, bool) {
	for _, a := range builtinAssets() {
		if a.Key == key {
			return a, true
		}
	}
	return Asset{}, false
}

// ErrAsset marks an asset reference that names no known asset.
var ErrAsset = errors.New("unknown asset")

// x402Networks maps the network names x402 v1 payloads use to CAIP-2 ids.
var x402Networks = map[string]string{
	"base":         "eip155:8453",
	"base-sepolia": "eip155:84532",
}

// NetworkCAIP2 turns an x402 network field into a CAIP-2 id: a known x402
// name is mapped, a well-formed CAIP-2 id passes through, anything else is
// an error.
func NetworkCAIP2(network string) (string, error) {
	if id, ok := x402Networks[network]; ok {
		return id, nil
	}
	if err := checkCAIP2(network); err != nil {
		return "", err
	}
	return network, nil
}

// checkCAIP2 enforces the CAIP-2 grammar: namespace [-a-z0-9]{3,8}, ":",
// reference [-_a-zA-Z0-9]{1,32}.
func checkCAIP2(s string) error {
	ns, ref, ok := strings.Cut(s, ":")
	if !ok {
		return fmt.Errorf("network %q is neither a known x402 name (base, base-sepolia) nor a CAIP-2 id such as eip155:8453", clip(s))
	}
	if len(ns) < 3 || len(ns) > 8 || !allBytes(ns, func(c byte) bool { return c == '-' || isDigit(c) || (c >= 'a' && c <= 'z') }) {
		return fmt.Errorf("network %q: the CAIP-2 namespace must be 3 to 8 characters of [-a-z0-9]", clip(s))
	}
	if len(ref) < 1 || len(ref) > 32 || !allBytes(ref, func(c byte) bool { return c == '-' || c == '_' || isDigit(c) || isAlpha(c) }) {
		return fmt.Errorf("network %q: the CAIP-2 reference must be 1 to 32 characters of [-_a-zA-Z0-9]", clip(s))
	}
	return nil
}

// AssetKey validates a token address on a network and returns the registry
// key. On eip155 networks the address must be 0x and 40 hex digits and is
// lower-cased; elsewhere it is kept as written.
func AssetKey(network, address string) (string, string, error) {
	if err := checkCAIP2(network); err != nil {
		return "", "", err
	}
	if strings.HasPrefix(network, "eip155:") {
		_, hex, err := addressDigits(address)
		if err != nil {
			return "", "", fmt.Errorf("token address: %w", err)
		}
		// One string for the key and the address (ParseAddress's) in it.
		var b strings.Builder
		b.Grow(len(network) + 3 + len(hex))
		b.WriteString(network)
		b.WriteByte('/')
		writeLowerAddress(&b, hex)
		key := b.String()
		return key, key[len(network)+1:], nil
	}
	if len(address) < 1 || len(address) > 128 || !allBytes(address, func(c byte) bool { return c == '-' || c == '.' || c == '%' || isDigit(c) || isAlpha(c) }) {
		return "", "", fmt.Errorf("token address %q must be 1 to 128 characters of [-.%%a-zA-Z0-9]", clip(address))
	}
	return network + "/" + address, address, nil
}

// parseAssetKey splits and validates "network/address".
func parseAssetKey(key string) (network, address, norm string, err error) {
	network, address, ok := strings.Cut(key, "/")
	if !ok {
		return "", "", "", fmt.Errorf("asset key %q must be a CAIP-2 network and a token address joined by \"/\"", clip(key))
	}
	norm, address, err = AssetKey(network, address)
	if err != nil {
		return "", "", "", fmt.Errorf("asset key %q: %w", clip(key), err)
	}
	return network, address, norm, nil
}

// Registry holds the assets a policy knows, by key.
type Registry struct {
	byKey map[string]Asset
}

func newRegistry() Registry {
	r := Registry{byKey: map[string]Asset{}}
	for _, a := range builtinAssets() {
		r.byKey[a.Key] = a
	}
	return r
}

// Lookup returns the asset with this exact registry key.
func (r Registry) Lookup(key string) (Asset, bool) {
	a, ok := r.byKey[key]
	return a, ok
}

// All lists the assets sorted by key.
func (r Registry) All() []Asset {
	out := make([]Asset, 0, len(r.byKey))
	for _, a := range r.byKey {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Resolve finds the asset a request names: a registry key
// ("eip155:8453/0x…"), a token address ("0x…", any case) or a symbol ("USDC",
// any case). When an address or symbol fits several assets, the policy's
// default asset wins if it is among them; otherwise the reference is
// ambiguous and refused.
func (r Registry) Resolve(ref string, def Asset) (Asset, error) {
	switch {
	case ref == "":
		return def, nil
	case len(ref) > 200:
		return Asset{}, fmt.Errorf("%w: the asset reference is %d characters long", ErrAsset, len(ref))
	case strings.Contains(ref, "/"):
		_, _, key, err := parseAssetKey(ref)
		if err != nil {
			return Asset{}, fmt.Errorf("%w: %w", ErrAsset, err)
		}
		if a, ok := r.byKey[key]; ok {
			return a, nil
		}
		return Asset{}, fmt.Errorf("%w: %q is not in the policy's asset registry", ErrAsset, clip(ref))
	}
	var hits []Asset
	if strings.HasPrefix(ref, "0x") || strings.HasPrefix(ref, "0X") {
		addr, err := ParseAddress(ref)
		if err != nil {
			return Asset{}, fmt.Errorf("%w: %w", ErrAsset, err)
		}
		for _, a := range r.All() {
			if a.Address == addr {
				hits = append(hits, a)
			}
		}
	} else {
		for _, a := range r.All() {
			if strings.EqualFold(a.Symbol, ref) {
				hits = append(hits, a)
			}
		}
	}
	switch len(hits) {
	case 0:
		return Asset{}, fmt.Errorf("%w: %q is neither a registry key, a token address nor a symbol the policy knows", ErrAsset, clip(ref))
	case 1:
		return hits[0], nil
	}
	keys := make([]string, 0, len(hits))
	for _, a := range hits {
		if a.Key == def.Key {
			return a, nil
		}
		keys = append(keys, a.Key)
	}
	return Asset{}, fmt.Errorf("%w: %q fits several assets (%s); give the registry key", ErrAsset, clip(ref), strings.Join(keys, ", "))
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }
func isHex(c byte) bool   { return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') }

func allBytes(s string, ok func(byte) bool) bool {
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return true
}

// clip shortens a hostile input before it goes into a message.
func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}

// networkNames are the people's names of the networks the guard knows.
var networkNames = map[string]string{
	"eip155:8453":  "Base",
	"eip155:84532": "Base Sepolia",
}

// Describe names the asset for people: its symbol and network, then its
// key, so two deployments of one symbol are never written alike.
func (a Asset) Describe() string {
	if n, ok := networkNames[a.Network]; ok {
		return fmt.Sprintf("%s on %s (%s)", a.Symbol, n, a.Key)
	}
	return fmt.Sprintf("%s on %s (%s)", a.Symbol, a.Network, a.Key)
}
