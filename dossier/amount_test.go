package dossier

import "testing"

func TestAmountText(t *testing.T) {
	for _, tc := range []struct{ network, token, value, want string }{
		{"eip155:8453", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "250000", "0.25 USDC (250000 atomic units)"},
		{"eip155:84532", "0x036cbd53842c5426634e7929541ec2318f3dcf7e", "2500000", "2.50 USDC (2500000 atomic units)"},
		{"eip155:8453", "0x00000000000000000000000000000000000000aa", "250000", "250000 atomic units"},
		{"eip155:8453", "not an address", "250000", "250000 atomic units"},
		{"eip155:8453", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "-5", "-5 atomic units"},
		{"eip155:8453", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "1e3", "1e3 atomic units"},
	} {
		if got := amountText(tc.network, tc.token, tc.value); got != tc.want {
			t.Errorf("amountText(%q, %q, %q) = %q, want %q", tc.network, tc.token, tc.value, got, tc.want)
		}
	}
}
