package app_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
)

// Open a stack on a Trace root holding one recorded run, ask the guard a
// question without recording it, and ask whether the stack is ready.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "haia-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, ".trace")
	run, err := os.ReadFile(filepath.Join("..", "testdata", "guard", "buyer-run.ndjson"))
	if err != nil {
		log.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "events"), 0o755); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "events", "buyer.ndjson"), run, 0o644); err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	st, err := app.Open(ctx, app.Config{
		Dir:           root,
		Signing:       app.Signing{KeyFile: filepath.Join(dir, "signing-key.pem"), Tenant: "example"},
		ReviewersPath: filepath.Join(dir, "reviewers.json"), // nobody trusted yet
		Store:         "file:",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	ans, err := st.Engine().CheckWith(ctx, "agent-1",
		engine.Question{Counterparty: "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", Amount: "0.10"},
		engine.CheckOptions{DryRun: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("decision:", ans.Decision)
	for _, r := range ans.Reasons {
		if r.Rule == "open_partial" {
			fmt.Println("because:", r.Rule, "on", len(r.Evidence), "operations of run", r.Evidence[0].RunID)
		}
	}

	var nr *engine.NotReadyError
	if err := st.Ready(ctx); errors.As(err, &nr) {
		fmt.Println("not ready:", nr.Reason)
	}
	// Output:
	// decision: review
	// because: open_partial on 3 operations of run buyer
	// not ready: the trusted reviewers file cannot be read
}
