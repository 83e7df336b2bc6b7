package guard

import (
	"fmt"
	"testing"
	"time"
)

func BenchmarkDecide10kOps(b *testing.B) {
	cfg := DefaultConfig()
	req, err := ParseRequest(RawRequest{Counterparty: addrA, Amount: "0.10"}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ops := make([]Op, 0, 10_000)
	for i := range 10_000 {
		o := op(fmt.Sprint("op-", i), 1000, time.Duration(i)*time.Minute)
		if i%3 == 0 {
			toB(&o)
		}
		ops = append(ops, o)
	}
	h := History{Ops: ops, Runs: 100}
	b.ReportAllocs()
	for b.Loop() {
		Decide(req, h, cfg, fixedNow)
	}
}
