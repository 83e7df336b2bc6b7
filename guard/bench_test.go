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

// BenchmarkDecideHostOnlyOpen times a question naming a host alone against
// an indexed history with many open operations with other hosts: what a
// decision reads of them is their count and the first maxEvidence, not
// each one.
func BenchmarkDecideHostOnlyOpen(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			cfg := DefaultConfig()
			req, err := ParseRequest(RawRequest{Counterparty: "svc7.example.com", Amount: "0.10"}, cfg)
			if err != nil {
				b.Fatal(err)
			}
			ops := make([]Op, 0, n)
			for i := range n {
				host := func(o *Op) { o.Money.Hosts = []string{fmt.Sprintf("svc%d.example.com", i%200)} }
				if i%4 == 0 {
					ops = append(ops, op(fmt.Sprint("op-", i), 1000, time.Duration(i)*time.Second, host, unsettled))
				} else {
					ops = append(ops, op(fmt.Sprint("op-", i), 1000, time.Duration(i)*time.Second, host))
				}
			}
			h := History{Ops: ops, Runs: 100}
			h.BuildIndex()
			b.ReportAllocs()
			for b.Loop() {
				Decide(req, h, cfg, fixedNow)
			}
		})
	}
}

// BenchmarkBuildIndex200kOpen indexes the history TestIngestThroughput's
// recorders leave after ~15 s: 200,000 open operations with one payee and
// one host, their times read once beforehand (as the catalog's summaries
// carry them). While ingest appends, a decision indexes it again.
func BenchmarkBuildIndex200kOpen(b *testing.B) {
	ops := make([]Op, 200_000)
	for i := range ops {
		o := op(fmt.Sprintf("op-%d", i), 500_000, time.Duration(len(ops)-i)*time.Millisecond, unsettled)
		o.FirstEventAt = o.LastEventAt
		ops[i] = CacheTimes(o)
	}
	b.ReportAllocs()
	for b.Loop() {
		h := History{Ops: ops, Runs: 4}
		h.BuildIndex()
	}
}
