package x402

import (
	"fmt"
	"math/big"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// PayerLimits bound what a payer signer process signs, whoever reaches its
// socket: how far ahead an authorization may stay valid (the server's
// maxAuthorizationSeconds) and how much one may move (--max-value, in the
// display units of the token it pays in). The server asks the engine
// before it signs; the signer process holds its own line.
type PayerLimits struct {
	// MaxSeconds caps validBefore at now plus this many seconds.
	MaxSeconds int64
	// MaxValue is the ceiling as written ("5.00"), read in the decimals of
	// each token.
	MaxValue string
	// Assets are the tokens whose decimals are known; any other token is
	// refused, since its value cannot be held to MaxValue.
	Assets guard.Registry
	Now    func() time.Time
}

// NewPayerLimits checks the limits: maxSeconds from MinAuthorizationSeconds
// to MaxTimeoutSeconds, maxValue a plain positive decimal.
func NewPayerLimits(maxSeconds int64, maxValue string, assets guard.Registry, now func() time.Time) (PayerLimits, error) {
	if maxSeconds < MinAuthorizationSeconds || maxSeconds > MaxTimeoutSeconds {
		return PayerLimits{}, fmt.Errorf("the longest validity must be from %d to %d seconds, not %d", MinAuthorizationSeconds, MaxTimeoutSeconds, maxSeconds)
	}
	if err := guard.CheckAmountSyntax(maxValue); err != nil {
		return PayerLimits{}, fmt.Errorf("--max-value %q is not a plain decimal such as \"5.00\"", clip(maxValue))
	}
	if v, err := guard.ParseAmount(maxValue, 36); err != nil || v.Sign() == 0 {
		return PayerLimits{}, fmt.Errorf("--max-value %q must be more than zero", clip(maxValue))
	}
	if now == nil {
		now = time.Now
	}
	return PayerLimits{MaxSeconds: maxSeconds, MaxValue: maxValue, Assets: assets, Now: now}, nil
}

// check says why an authorization may not be signed under l, and which
// asset it pays in.
func (l PayerLimits) check(d Domain, a Authorization) (guard.Asset, error) {
	key := "eip155:" + d.ChainID.String() + "/" + d.VerifyingContract.Lower()
	asset, ok := l.Assets.Lookup(key)
	if !ok {
		return guard.Asset{}, fmt.Errorf("the token %s on chain %s is not among this signer's assets (its --guard-config names the others), so its value cannot be held to --max-value %s; not signed",
			d.VerifyingContract.Hex(), d.ChainID, l.MaxValue)
	}
	ceiling, err := guard.ParseAmount(l.MaxValue, asset.Decimals)
	if err != nil {
		return asset, fmt.Errorf("--max-value %s cannot be read in the %d decimals of %s; not signed", l.MaxValue, asset.Decimals, asset.Symbol)
	}
	if a.Value.Cmp(ceiling) > 0 {
		return asset, fmt.Errorf("the value %s is above this signer's --max-value %s; not signed",
			display(a.Value, asset), display(ceiling, asset))
	}
	latest := big.NewInt(l.Now().Unix() + l.MaxSeconds)
	if a.ValidBefore.Cmp(latest) > 0 {
		ahead := new(big.Int).Sub(a.ValidBefore, big.NewInt(l.Now().Unix()))
		return asset, fmt.Errorf("validBefore %s is %s seconds ahead; this signer signs authorizations valid for at most %d seconds (maxAuthorizationSeconds); not signed",
			clip(a.ValidBefore.String()), clip(ahead.String()), l.MaxSeconds)
	}
	return asset, nil
}

// display writes atomic units of asset as "0.25 USDC".
func display(atomic *big.Int, asset guard.Asset) string {
	return guard.FormatAmount(atomic, asset.Decimals) + " " + asset.Symbol
}
