package x402

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"golang.org/x/crypto/sha3"
)

// Keccak256 is the Keccak-256 of the concatenated parts (Ethereum's hash,
// not NIST SHA3-256).
func Keccak256(parts ...[]byte) [32]byte {
	h := sha3.NewLegacyKeccak256()
	for _, p := range parts {
		h.Write(p)
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

var (
	domainTypeHash = Keccak256([]byte("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"))
	// TransferTypeHash is EIP-3009's TransferWithAuthorization type hash.
	transferTypeHash = Keccak256([]byte("TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"))
)

// Address is a 20-byte EVM address.
type Address [20]byte

// ParseAddress reads 0x and 40 hex digits (any case; a mixed-case address
// must carry a correct EIP-55 checksum, as the reference libraries require).
func ParseAddress(s string) (Address, error) {
	var a Address
	if len(s) != 42 || (s[:2] != "0x" && s[:2] != "0X") {
		return a, fmt.Errorf("%q is not an address (0x and 40 hex digits)", clip(s))
	}
	b, err := hex.DecodeString(s[2:])
	if err != nil {
		return a, fmt.Errorf("%q is not an address (0x and 40 hex digits)", clip(s))
	}
	copy(a[:], b)
	body := s[2:]
	if body != strings.ToLower(body) && body != strings.ToUpper(body) && a.Hex() != "0x"+body {
		return a, fmt.Errorf("%q has a wrong EIP-55 checksum (mixed case that is not the address's checksum)", clip(s))
	}
	return a, nil
}

// Hex is the EIP-55 checksummed form.
func (a Address) Hex() string {
	low := hex.EncodeToString(a[:])
	h := Keccak256([]byte(low))
	out := []byte(low)
	for i := range out {
		if out[i] >= 'a' && h[i/2]>>(4*(1-uint(i%2)))&0xf >= 8 {
			out[i] -= 'a' - 'A'
		}
	}
	return "0x" + string(out)
}

// Lower is the lower-case 0x form (the guard's canonical address).
func (a Address) Lower() string { return "0x" + hex.EncodeToString(a[:]) }

// ChainID reads an EVM CAIP-2 network ("eip155:8453") as its chain id.
func ChainID(network string) (*big.Int, error) {
	ref, ok := strings.CutPrefix(network, "eip155:")
	if !ok {
		return nil, fmt.Errorf("network %q is not an EVM network (eip155:<chain id>)", clip(network))
	}
	n, err := strconv.ParseUint(ref, 10, 63)
	if err != nil || n == 0 || ref[0] == '0' {
		return nil, fmt.Errorf("network %q: the chain id must be a positive decimal number", clip(network))
	}
	return new(big.Int).SetUint64(n), nil
}

// Domain is the EIP-712 domain of an EIP-3009 token.
type Domain struct {
	Name, Version     string
	ChainID           *big.Int
	VerifyingContract Address
}

// Authorization is an EIP-3009 TransferWithAuthorization message.
type Authorization struct {
	From, To                Address
	Value                   *big.Int
	ValidAfter, ValidBefore *big.Int
	Nonce                   [32]byte
}

func word(n *big.Int) ([]byte, error) {
	if n == nil || n.Sign() < 0 || n.BitLen() > 256 {
		return nil, errors.New("a uint256 field is missing, negative or too large")
	}
	return n.FillBytes(make([]byte, 32)), nil
}

func addrWord(a Address) []byte {
	w := make([]byte, 32)
	copy(w[12:], a[:])
	return w
}

// Separator is the EIP-712 domain separator.
func (d Domain) Separator() ([32]byte, error) {
	cid, err := word(d.ChainID)
	if err != nil {
		return [32]byte{}, fmt.Errorf("chain id: %w", err)
	}
	n, v := Keccak256([]byte(d.Name)), Keccak256([]byte(d.Version))
	return Keccak256(domainTypeHash[:], n[:], v[:], cid, addrWord(d.VerifyingContract)), nil
}

// Digest is the EIP-712 hash a wallet signs for this authorization under
// this domain: keccak256(0x19 0x01 ‖ domainSeparator ‖ hashStruct(message)).
func Digest(d Domain, a Authorization) ([32]byte, error) {
	sep, err := d.Separator()
	if err != nil {
		return [32]byte{}, err
	}
	fields := [][]byte{transferTypeHash[:], addrWord(a.From), addrWord(a.To)}
	for _, n := range []*big.Int{a.Value, a.ValidAfter, a.ValidBefore} {
		w, err := word(n)
		if err != nil {
			return [32]byte{}, err
		}
		fields = append(fields, w)
	}
	fields = append(fields, a.Nonce[:])
	st := Keccak256(fields...)
	return Keccak256([]byte{0x19, 0x01}, sep[:], st[:]), nil
}

// NonceFor derives the authorization's nonce from the signed decision
// receipt that allowed it: keccak256("haia-trace-mcp/x402-nonce/v1" ‖ 0x00 ‖
// receipt id). The on-chain nonce thereby names its decision, and one
// decision can never yield two usable authorizations (the token refuses a
// nonce twice).
func NonceFor(receiptID string) [32]byte {
	return Keccak256([]byte("haia-trace-mcp/x402-nonce/v1"), []byte{0}, []byte(receiptID))
}
