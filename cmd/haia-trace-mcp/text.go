package main

import (
	"math/big"
	"strconv"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// count is n and its noun, singular for one: "1 run", "2 runs".
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// amountText is an amount as every command prints it: the display decimal
// with at least two fraction digits (guard.FormatDisplay) and the asset's
// symbol, "0.40 USDC"; an asset the policy does not know is named by its
// registry key, with the amount in atomic units.
func amountText(atomic *big.Int, asset string, assets guard.Registry) string {
	if a, ok := assets.Lookup(asset); ok && a.Symbol != "" {
		return guard.FormatDisplay(atomic, a.Decimals) + " " + a.Symbol
	}
	return atomic.String() + " atomic units of " + asset
}

// decimalText is a decimal amount of asset (as a question or a review
// states it, "0.4") printed as amountText prints it; one the asset cannot
// hold, or of an asset the policy does not know, is printed as given.
func decimalText(amount, asset string, assets guard.Registry) string {
	if a, ok := assets.Lookup(asset); ok && a.Symbol != "" {
		return displayDecimal(amount, asset, assets) + " " + a.Symbol
	}
	if asset == "" {
		return amount
	}
	return amount + " " + asset
}

// displayDecimal is the number of decimalText alone: amount in the
// asset's display form, or as given when it cannot be read so.
func displayDecimal(amount, asset string, assets guard.Registry) string {
	if a, ok := assets.Lookup(asset); ok {
		if n, err := guard.ParseAmount(amount, a.Decimals); err == nil {
			return guard.FormatDisplay(n, a.Decimals)
		}
	}
	return amount
}
