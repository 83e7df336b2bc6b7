package x402

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/pbkdf2"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/decred/dcrd/dcrec/secp256k1/v4"
	"github.com/decred/dcrd/dcrec/secp256k1/v4/ecdsa"
	"golang.org/x/crypto/scrypt"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Signer signs EIP-3009 authorizations for one payer address. It signs
// only TransferWithAuthorization messages whose from is its own address:
// never a raw digest, so whoever reaches it cannot have it sign anything
// else (a permit, a transaction, a message).
type Signer interface {
	Address() Address
	SignAuthorization(ctx context.Context, d Domain, a Authorization) ([65]byte, error)
}

// KeySigner holds the payer key in this process.
type KeySigner struct {
	key  *secp256k1.PrivateKey
	addr Address
}

// NewKeySigner wraps a private key.
func NewKeySigner(key *secp256k1.PrivateKey) *KeySigner {
	return &KeySigner{key: key, addr: AddressOf(key.PubKey())}
}

// AddressOf is the EVM address of a public key: the last 20 bytes of the
// Keccak-256 of its uncompressed coordinates.
func AddressOf(pub *secp256k1.PublicKey) Address {
	h := Keccak256(pub.SerializeUncompressed()[1:])
	var a Address
	copy(a[:], h[12:])
	return a
}

// Address is the payer address.
func (s *KeySigner) Address() Address { return s.addr }

// SignAuthorization signs the EIP-712 digest of a and returns r ‖ s ‖ v
// with v 27 or 28 (low s, as EIP-2 requires).
func (s *KeySigner) SignAuthorization(_ context.Context, d Domain, a Authorization) ([65]byte, error) {
	var sig [65]byte
	if a.From != s.addr {
		return sig, fmt.Errorf("refused: the authorization is from %s, and this signer pays from %s", a.From.Hex(), s.addr.Hex())
	}
	digest, err := Digest(d, a)
	if err != nil {
		return sig, err
	}
	c := ecdsa.SignCompact(s.key, digest[:], false)
	copy(sig[:64], c[1:])
	sig[64] = c[0]
	return sig, nil
}

// Recover returns the address that made sig (r ‖ s ‖ v, v 27/28 or 0/1)
// over digest.
func Recover(digest [32]byte, sig [65]byte) (Address, error) {
	v := sig[64]
	if v < 27 {
		v += 27
	}
	if v != 27 && v != 28 {
		return Address{}, errors.New("signature: v must be 27 or 28")
	}
	c := make([]byte, 65)
	c[0] = v
	copy(c[1:], sig[:64])
	pub, _, err := ecdsa.RecoverCompact(c, digest[:])
	if err != nil {
		return Address{}, fmt.Errorf("signature: %w", err)
	}
	return AddressOf(pub), nil
}

// ParseKey reads a payer key: 64 hex digits, "0x" optional, surrounding
// white space (a trailing newline) allowed; or an Ethereum keystore v3
// JSON file, decrypted with password. The key is checked to be a valid
// secp256k1 scalar (not zero, below the group order).
func ParseKey(data, password []byte) (*secp256k1.PrivateKey, error) {
	text := bytes.TrimSpace(data)
	if bytes.HasPrefix(text, []byte("{")) {
		if password == nil {
			return nil, errors.New("this is a keystore file; give its password with --payer-key-password-file")
		}
		return decryptKeystore(text, password)
	}
	if password != nil {
		return nil, errors.New("a password was given, but the key file holds a plain hex key, not a keystore")
	}
	s := string(text)
	s = strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	if len(s) != 64 {
		return nil, fmt.Errorf("a payer key is 64 hex digits (0x optional) or a keystore v3 JSON file; this holds %d characters", len(s))
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, errors.New("a payer key is 64 hex digits (0x optional); this holds other characters")
	}
	return scalarKey(b)
}

func scalarKey(b []byte) (*secp256k1.PrivateKey, error) {
	var k secp256k1.ModNScalar
	if overflow := k.SetByteSlice(b); overflow || k.IsZero() {
		return nil, errors.New("the key is not a valid secp256k1 private key (zero, or not below the curve order)")
	}
	return secp256k1.NewPrivateKey(&k), nil
}

// LoadKeyFile reads the payer key from path (and the keystore password
// from passwordPath, when set) with the receipt key's hardening: no
// symbolic link, a regular file owned by this user, mode 0600 or stricter.
func LoadKeyFile(path, passwordPath string) (*secp256k1.PrivateKey, error) {
	data, err := noa.ReadSecretFile(path, "payer key file")
	if err != nil {
		return nil, err
	}
	var password []byte
	if passwordPath != "" {
		pw, err := noa.ReadSecretFile(passwordPath, "payer key password file")
		if err != nil {
			return nil, err
		}
		password = bytes.TrimSuffix(bytes.TrimSuffix(pw, []byte("\n")), []byte("\r"))
	}
	key, err := ParseKey(data, password)
	if err != nil {
		return nil, fmt.Errorf("payer key file %s: %w", path, err)
	}
	return key, nil
}

// Keystore v3 limits: the reference wallets write scrypt n = 2^18, r = 8,
// p = 1 (or 2^12 "light"); a file asking for more is refused rather than
// left to take the machine's memory.
const (
	maxScryptN    = 1 << 20
	maxScryptR    = 16
	maxScryptP    = 16
	maxPBKDF2Iter = 10_000_000
)

type keystoreV3 struct {
	Version int    `json:"version"`
	Address string `json:"address"`
	Crypto  struct {
		Cipher       string `json:"cipher"`
		Ciphertext   string `json:"ciphertext"`
		CipherParams struct {
			IV string `json:"iv"`
		} `json:"cipherparams"`
		KDF       string          `json:"kdf"`
		KDFParams json.RawMessage `json:"kdfparams"`
		MAC       string          `json:"mac"`
	} `json:"crypto"`
}

func decryptKeystore(data, password []byte) (*secp256k1.PrivateKey, error) {
	if err := checkStrict(data); err != nil {
		return nil, fmt.Errorf("keystore: %w", err)
	}
	var ks keystoreV3
	if err := json.Unmarshal(data, &ks); err != nil {
		return nil, errors.New("keystore: not a keystore v3 JSON object")
	}
	if ks.Version != 3 {
		return nil, fmt.Errorf("keystore: version %d is not supported (3 is)", ks.Version)
	}
	if ks.Crypto.Cipher != "aes-128-ctr" {
		return nil, fmt.Errorf("keystore: cipher %q is not supported (aes-128-ctr is)", clip(ks.Crypto.Cipher))
	}
	ct, err1 := hex.DecodeString(ks.Crypto.Ciphertext)
	iv, err2 := hex.DecodeString(ks.Crypto.CipherParams.IV)
	mac, err3 := hex.DecodeString(ks.Crypto.MAC)
	if err1 != nil || err2 != nil || err3 != nil || len(ct) != 32 || len(iv) != 16 || len(mac) != 32 {
		return nil, errors.New("keystore: ciphertext (32 bytes), cipherparams.iv (16 bytes) and mac (32 bytes) must be hex")
	}
	var dk []byte
	switch ks.Crypto.KDF {
	case "scrypt":
		var p struct {
			N, R, P, DKLen int
			Salt           string
		}
		if err := json.Unmarshal(ks.Crypto.KDFParams, &p); err != nil {
			return nil, errors.New("keystore: kdfparams must hold n, r, p, dklen and salt")
		}
		salt, err := hex.DecodeString(p.Salt)
		switch {
		case err != nil || len(salt) == 0 || len(salt) > 64:
			return nil, errors.New("keystore: kdfparams.salt must be 1 to 64 bytes of hex")
		case p.DKLen != 32:
			return nil, errors.New("keystore: kdfparams.dklen must be 32")
		case p.N < 2 || p.N > maxScryptN || p.N&(p.N-1) != 0 || p.R < 1 || p.R > maxScryptR || p.P < 1 || p.P > maxScryptP:
			return nil, fmt.Errorf("keystore: scrypt parameters n=%d r=%d p=%d are outside what is accepted (n a power of two up to %d, r up to %d, p up to %d)", p.N, p.R, p.P, maxScryptN, maxScryptR, maxScryptP)
		}
		if dk, err = scrypt.Key(password, salt, p.N, p.R, p.P, 32); err != nil {
			return nil, fmt.Errorf("keystore: scrypt: %w", err)
		}
	case "pbkdf2":
		var p struct {
			C     int
			DKLen int
			PRF   string
			Salt  string
		}
		if err := json.Unmarshal(ks.Crypto.KDFParams, &p); err != nil {
			return nil, errors.New("keystore: kdfparams must hold c, dklen, prf and salt")
		}
		salt, err := hex.DecodeString(p.Salt)
		switch {
		case err != nil || len(salt) == 0 || len(salt) > 64:
			return nil, errors.New("keystore: kdfparams.salt must be 1 to 64 bytes of hex")
		case p.DKLen != 32 || p.PRF != "hmac-sha256":
			return nil, errors.New("keystore: pbkdf2 needs dklen 32 and prf hmac-sha256")
		case p.C < 1 || p.C > maxPBKDF2Iter:
			return nil, fmt.Errorf("keystore: pbkdf2 count %d is outside 1..%d", p.C, maxPBKDF2Iter)
		}
		if dk, err = pbkdf2.Key(sha256.New, string(password), salt, p.C, 32); err != nil {
			return nil, fmt.Errorf("keystore: pbkdf2: %w", err)
		}
	default:
		return nil, fmt.Errorf("keystore: kdf %q is not supported (scrypt and pbkdf2 are)", clip(ks.Crypto.KDF))
	}
	want := Keccak256(dk[16:32], ct)
	if subtle.ConstantTimeCompare(want[:], mac) != 1 {
		return nil, errors.New("keystore: wrong password (the MAC does not match)")
	}
	block, err := aes.NewCipher(dk[:16])
	if err != nil {
		return nil, fmt.Errorf("keystore: %w", err)
	}
	plain := make([]byte, len(ct))
	cipher.NewCTR(block, iv).XORKeyStream(plain, ct)
	key, err := scalarKey(plain)
	if err != nil {
		return nil, fmt.Errorf("keystore: %w", err)
	}
	if ks.Address != "" {
		got := AddressOf(key.PubKey())
		if !strings.EqualFold(strings.TrimPrefix(ks.Address, "0x"), strings.TrimPrefix(got.Lower(), "0x")) {
			return nil, fmt.Errorf("keystore: the key decrypts to %s, not the file's address %s", got.Hex(), clip(ks.Address))
		}
	}
	return key, nil
}
