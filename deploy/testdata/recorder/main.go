// Command recorder stands in for an agent's Trace recorder in the container
// test: it appends the Event Contract lines of two simulated x402 payments
// (one seller settles, one never does) to <root>/events/<run>.ndjson and
// exits. It is built statically and run in a container of its own that
// shares the Trace volume with the server.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

func main() {
	root := flag.String("root", "/trace", "the Trace root")
	run := flag.String("run", "run-container", "the run id (file name without .ndjson)")
	settles := flag.String("seller-settles", "", "address of the seller who settles")
	silent := flag.String("seller-silent", "", "address of the seller who never settles")
	flag.Parse()
	if *settles == "" || *silent == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: recorder --seller-settles ADDR --seller-silent ADDR [--root DIR] [--run ID]")
		os.Exit(2)
	}
	rec, err := simrec.New(*root, *run, time.Now().Add(-10*time.Minute))
	if err != nil {
		fmt.Fprintln(os.Stderr, "recorder:", err)
		os.Exit(1)
	}
	err = rec.PayAll([]simrec.Payment{
		{OperationID: "op-settled", URL: "https://reports.example.com/weekly", PayTo: *settles, Amount: "250000", Outcome: "settled"},
		{OperationID: "op-silent", URL: "https://quotes.example.net/live", PayTo: *silent, Amount: "400000", Outcome: "unsettled"},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "recorder:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", rec.Path())
}
