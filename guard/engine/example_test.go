package engine_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// A Go program embeds the guard: it opens a Trace root, builds the engine
// once, and asks before each payment. The answer it gets is already in the
// review log and signed into the decision chain.
func Example() {
	dir, _ := os.MkdirTemp("", "trace")
	defer os.RemoveAll(dir)
	// A recorder wrote one payment that left and never settled.
	rec, _ := simrec.New(dir, "run-1", time.Now().Add(-time.Hour))
	_ = rec.Pay(simrec.Payment{OperationID: "op-1", URL: "https://quotes.example.net/live",
		PayTo: "0xB0B0000000000000000000000000000000000002", Amount: "400000", Outcome: "unsettled"})

	root, _ := confined.OpenRoot(dir)
	defer root.Close()
	events, _ := root.OpenDir("events")
	defer events.Close()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	eng, err := engine.New(engine.Config{
		Policy:    guard.DefaultConfig(),
		Templates: receipt.Resolver{}, // the bundled templates
		History:   engine.ScanHistory{Events: events},
		Log:       reviewlog.OpenStore(filestore.New(root), reviewlog.Options{}),
		Chains:    &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "example"},
		ParamsKey: engine.ParamsKeyFrom(key.Seed()),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ans, err := eng.Check(context.Background(), "my-agent", engine.Question{
		Counterparty: "0xb0b0000000000000000000000000000000000002", Amount: "0.25", Asset: "USDC"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ans.Decision, ans.Reasons[0].Rule, ans.Reasons[0].Evidence)
	chains, _ := filepath.Glob(filepath.Join(dir, "guard", "receipts", "decisions-*.ndjson"))
	fmt.Println("chains:", len(chains), "review opened:", ans.ReviewID != "")
	// Output:
	// review open_partial [{run-1 op-1}]
	// chains: 1 review opened: true
}
