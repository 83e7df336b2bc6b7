package steptime

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
)

func TestClock(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		level slog.Level
		want  []string
	}{
		{"debug logs each step and the total", slog.LevelDebug, []string{"read", "decide", "total", "tool"}},
		{"info logs nothing", slog.LevelInfo, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			l := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
			c := Start(ctx, l)
			c.Step("read")
			c.Step("decide")
			c.Log(ctx, l, "steps", "tool", "pay")
			if tc.want == nil {
				if buf.Len() != 0 || c.attrs != nil {
					t.Fatalf("logged or kept at %v: %q %v", tc.level, buf.String(), c.attrs)
				}
				return
			}
			var line map[string]any
			if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
				t.Fatalf("%v: %q", err, buf.String())
			}
			if line["msg"] != "steps" || line["level"] != "DEBUG" {
				t.Fatalf("line: %v", line)
			}
			for _, k := range tc.want {
				if _, ok := line[k]; !ok {
					t.Errorf("no %s in %v", k, line)
				}
			}
			if line["read"].(float64) > line["total"].(float64) || line["decide"].(float64) > line["total"].(float64) {
				t.Errorf("a step longer than the whole: %v", line)
			}
		})
	}
	// A nil logger (an Authorizer or Proxy built without one) times nothing.
	c := Start(ctx, nil)
	c.Step("x")
	c.Log(ctx, nil, "steps")
}
