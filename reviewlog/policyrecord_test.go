package reviewlog_test

import (
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

func TestParsePolicyRecordRefuses(t *testing.T) {
	for _, c := range []struct{ data, want string }{
		{`not json`, "not valid JSON"},
		{`{}`, "lacks"},
		{`{"source": "x", "at": "t", "text": "{}"}`, "lacks"},
		{`{"source": "x", "at": "t", "sha256": "ab"}`, "lacks"},
		{`{"source": "x", "text": "{}", "sha256": "ab"}`, "lacks"},
		{`{"source": "x", "at": "t"}` + strings.Repeat(" ", reviewlog.MaxPolicyRecord), "larger than"},
		{`{"source": "x", "at": "t", "tenant": "../acme"}`, "tenant"},
		{`{"source": "x", "at": "t", "refused": {"source": "p.json", "at": "t"}}`, "refused reload lacks"},
	} {
		if _, err := reviewlog.ParsePolicyRecord([]byte(c.data)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.60q: %v, want an error mentioning %q", c.data, err, c.want)
		}
	}
}

func FuzzParsePolicyRecord(f *testing.F) {
	f.Add([]byte(`{"source": "/p.json", "sha256": "ab", "text": "{}", "at": "2026-12-01T10:00:00Z"}`))
	f.Add([]byte(`{"source": "built-in defaults", "at": "t"}`))
	f.Add([]byte(`{"source": "\u0000", "at": ""}`))
	f.Add([]byte(`{"source": "/p.json", "at": "t", "tenant": "acme", "refused": {"source": "/q.json", "at": "t", "error": "bad"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := reviewlog.ParsePolicyRecord(data)
		if err != nil {
			return
		}
		if rec.Source == "" || rec.At == "" || (rec.Text == "") != (rec.SHA256 == "") || (rec.Tenant != "" && reviewlog.CheckTenant(rec.Tenant) != nil) ||
			(rec.Refused != nil && (rec.Refused.Source == "" || rec.Refused.At == "" || rec.Refused.Error == "")) {
			t.Fatalf("accepted an incomplete record %+v", rec)
		}
	})
}
