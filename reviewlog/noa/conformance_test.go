package noa

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// sharedNOA returns $HAIA_SHARED/noa or skips.
func sharedNOA(t *testing.T) string {
	t.Helper()
	root := os.Getenv("HAIA_SHARED")
	if root == "" {
		t.Skip("HAIA_SHARED not set: skipping the NOA conformance vectors and golden chains")
	}
	return filepath.Join(root, "noa")
}

// conformanceRow is one line of expected-verdicts.tsv: the arguments of the
// reference CLI (chain, optional positional keyring, --checkpoint C,
// --identity M) and its exit code.
type conformanceRow struct {
	line int
	args []string
	exit int
}

func readConformance(t *testing.T, dir string) []conformanceRow {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "conformance", "expected-verdicts.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []conformanceRow
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			continue
		}
		cols := strings.Split(line, "\t")
		if len(cols) != 2 {
			t.Fatalf("expected-verdicts.tsv line %d: want 2 tab-separated columns, got %d", n, len(cols))
		}
		code, err := strconv.Atoi(strings.TrimSpace(cols[1]))
		if err != nil {
			t.Fatalf("expected-verdicts.tsv line %d: exit code: %v", n, err)
		}
		rows = append(rows, conformanceRow{line: n, args: strings.Fields(cols[0]), exit: code})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// documentsFor reads the files a row names, relative to conformance/.
func documentsFor(t *testing.T, base string, args []string) Documents {
	t.Helper()
	read := func(p string) []byte {
		b, err := os.ReadFile(filepath.Join(base, p))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var d Documents
	var positional []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--checkpoint":
			i++
			d.Checkpoint = read(args[i])
		case "--identity":
			i++
			d.Identity = read(args[i])
		case "--keyring":
			i++
			d.Keyring = read(args[i])
		default:
			positional = append(positional, args[i])
		}
	}
	if len(positional) < 1 || len(positional) > 2 {
		t.Fatalf("row %v: want a chain and an optional keyring", args)
	}
	d.Chain = bytes.NewReader(read(positional[0]))
	if len(positional) == 2 {
		d.Keyring = read(positional[1])
	}
	return d
}

func TestConformanceVectors(t *testing.T) {
	dir := sharedNOA(t)
	base := filepath.Join(dir, "conformance")
	rows := readConformance(t, dir)
	if len(rows) < 40 {
		t.Fatalf("only %d rows in expected-verdicts.tsv", len(rows))
	}
	for _, row := range rows {
		t.Run(strconv.Itoa(row.line)+"_"+strings.Join(row.args, "_"), func(t *testing.T) {
			res := VerifyDocuments(documentsFor(t, base, row.args))
			if got := res.Verdict.ExitCode(); got != row.exit {
				t.Fatalf("exit %d (%s), want %d", got, res.Line(), row.exit)
			}
		})
	}
}
