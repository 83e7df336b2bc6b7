package main

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// bigVerifyRSSBound bounds verify's peak resident memory on a chain of any
// length: it holds one receipt at a time.
const (
	bigVerifyRSSBound     = 64 << 20
	bigVerifyRSSBoundRace = 160 << 20
)

// chainWriter writes a signed chain in this product's file form directly,
// receipt by receipt, without going through Seal: the bytes are laid out
// in canonical (JCS) member order, hashed and signed here, which is fast
// enough to build a million receipts in a test. verify is what checks
// that they are right.
type chainWriter struct {
	key    ed25519.PrivateKey
	kid    string
	tenant string
	t0     time.Time
}

type bigReceipt struct {
	chain, id, ts, agent, principal, canonical, actionID, risk, paramsHash, verdict string
	seq                                                                             int64
	seg                                                                             int    // segment number
	prevHash                                                                        string // "" for genesis
}

// body lays out a receipt with hash and sig given ("" leaves the member
// out, which is the hash input).
func (r *bigReceipt) body(hash, sig, kid, tenant string) []byte {
	var b strings.Builder
	b.Grow(900)
	fmt.Fprintf(&b, `{"action":{"canonical":%q,"id":%q,"paramsHash":%q,"reversible":false,"riskClass":%q,"rollbackRef":null},`, r.canonical, r.actionID, r.paramsHash, r.risk)
	fmt.Fprintf(&b, `"agent":{"id":%q,"model":null,"principal":%q},"chain":{`, r.agent, r.principal)
	if hash != "" {
		fmt.Fprintf(&b, `"hash":%q,`, hash)
	}
	if r.prevHash == "" {
		b.WriteString(`"prevHash":null,`)
	} else {
		fmt.Fprintf(&b, `"prevHash":%q,`, r.prevHash)
	}
	fmt.Fprintf(&b, `"seq":%d},"governance":{"approval":null,"mode":"on","ruleId":null,"sandboxed":false,"verdict":%q},`, r.seq, r.verdict)
	fmt.Fprintf(&b, `"id":%q,"scope":{"chain":%q,"tenant":%q},"sig":{"alg":"ed25519","kid":%q`, r.id, r.chain, tenant, kid)
	if sig != "" {
		fmt.Fprintf(&b, `,"value":%q`, sig)
	}
	fmt.Fprintf(&b, `},"spec":"noa.receipt/0.1","ts":%q}`, r.ts)
	return []byte(b.String())
}

// write lays out total receipts of chain base in segments of segment
// receipts (a continuation opening each after the first) under dir, and
// returns the segment files.
func (w *chainWriter) write(t *testing.T, dir, base string, total, segment int) []string {
	t.Helper()
	const batch = 4096
	var files []string
	var out *bufio.Writer
	var f *os.File
	closeSeg := func() {
		if f == nil {
			return
		}
		if err := out.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	prevHash, prevChain := "", ""
	var seq int64
	k := -1
	pending := make([]bigReceipt, 0, batch)
	hashes := make([]string, 0, batch)
	flush := func() {
		sigs := make([]string, len(pending))
		var wg sync.WaitGroup
		workers := runtime.GOMAXPROCS(0)
		for wi := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := wi; i < len(pending); i += workers {
					sum, _ := hex.DecodeString(strings.TrimPrefix(hashes[i], "sha256:"))
					sigs[i] = base64.StdEncoding.EncodeToString(ed25519.Sign(w.key, append([]byte("NOA-Receipt-v0.1-sig:"), sum...)))
				}
			}()
		}
		wg.Wait()
		for i := range pending {
			if pending[i].seq == 0 {
				closeSeg()
				p := filepath.Join(dir, reviewlog.SegmentFile(base, pending[i].seg))
				var err error
				if f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
					t.Fatal(err)
				}
				out = bufio.NewWriterSize(f, 1<<20)
				files = append(files, p)
			}
			out.Write(pending[i].body(hashes[i], sigs[i], w.kid, w.tenant))
			out.WriteByte('\n')
		}
		pending, hashes = pending[:0], hashes[:0]
	}
	for i := range total {
		if i%segment == 0 {
			k++
			seq = 0
		}
		chain := noa.SegmentChain(base, k)
		r := bigReceipt{
			chain: chain, seq: seq, seg: k, prevHash: prevHash,
			id: "rcpt_big_" + strconv.Itoa(i), ts: w.t0.Add(time.Duration(i) * time.Millisecond).Format("2006-01-02T15:04:05.000Z"),
			agent: "agent-" + strconv.Itoa(i%7), principal: noa.PrincipalService,
			canonical: "payment.x402", actionID: "x402.pay", risk: "IRREVERSIBLE",
			paramsHash: "hmac-sha256:" + strings.Repeat(strconv.Itoa(i%10), 64), verdict: noa.VerdictAllowed,
		}
		if seq == 0 {
			r.prevHash = ""
			if k > 0 {
				r.agent, r.canonical, r.actionID, r.risk, r.paramsHash, r.verdict = noa.ContinueAgent, noa.ContinueCanonical, prevChain, "LOW", prevHash, noa.VerdictExecuted
			}
		}
		input := r.body("", "", w.kid, w.tenant)
		sum := sha256.Sum256(input)
		h := "sha256:" + hex.EncodeToString(sum[:])
		pending, hashes = append(pending, r), append(hashes, h)
		prevHash, prevChain = h, chain
		seq++
		if len(pending) == batch {
			flush()
		}
	}
	flush()
	closeSeg()
	return files
}

// TestVerifyBigChain builds a chain and verifies it with the real binary,
// reporting the time and peak memory. With HAIA_BIG=1 the chain has
// 1,000,000 receipts, once as one file (past noa.MaxReceipts, which only
// the whole-file path has) and once in segments followed end to end;
// otherwise a few thousand, which checks the same paths quickly.
func TestVerifyBigChain(t *testing.T) {
	total, segment := 3000, 1000
	if os.Getenv("HAIA_BIG") == "1" {
		total, segment = 1_000_000, 65_536
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kid := noa.KeyID(key.Public().(ed25519.PublicKey))
	dir := t.TempDir()
	kr := noa.Keyring{}
	kr.Add(kid, key.Public().(ed25519.PublicKey))
	krJSON, err := kr.JSON()
	if err != nil {
		t.Fatal(err)
	}
	keyring := filepath.Join(dir, "keyring.json")
	if err := os.WriteFile(keyring, krJSON, 0o600); err != nil {
		t.Fatal(err)
	}
	w := &chainWriter{key: key, kid: kid, tenant: "ops", t0: time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)}

	for _, c := range []struct {
		name    string
		segment int
		args    []string
	}{
		{"one file", total + 1, nil},
		{"segments", segment, []string{"--follow"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sub := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			if err := os.Mkdir(sub, 0o700); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			files := w.write(t, sub, "decisions-"+kid, total, c.segment)
			built := time.Since(start)
			var size int64
			for _, p := range files {
				st, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				size += st.Size()
			}

			args := append([]string{"verify", files[0], "--keyring", keyring}, c.args...)
			cmd := exec.Command(binPath, args...)
			var out, errOut strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &errOut
			start = time.Now()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			stopWatch := watchPeakRSS(cmd.Process.Pid)
			err := cmd.Wait()
			took := time.Since(start)
			peak, seen := stopWatch()
			if err != nil {
				t.Fatalf("verify: %v\n%s%s", err, out.String(), errOut.String())
			}
			want := fmt.Sprintf("VALID: %d receipts", total)
			if len(files) > 1 {
				want += fmt.Sprintf(" in %d segments", len(files))
			}
			if !strings.HasPrefix(out.String(), want) {
				t.Fatalf("verify: %q, want %q", out.String(), want)
			}
			if !seen {
				if runtime.GOOS == "linux" {
					t.Fatal("verify's peak memory was never read from /proc/PID/status (VmHWM) while it ran")
				}
				t.Skip("verify's peak memory is read from /proc/PID/status (VmHWM), which only Linux has")
			}
			bound := int64(bigVerifyRSSBound)
			if binRace {
				bound = bigVerifyRSSBoundRace
			}
			t.Logf("%d receipts in %d file(s), %.0f MiB: built in %s, verify took %s, peak RSS %.1f MiB (bound %d MiB, race build: %v)",
				total, len(files), float64(size)/(1<<20), built.Round(time.Millisecond), took.Round(time.Millisecond), float64(peak)/(1<<20), bound>>20, binRace)
			if peak > bound {
				t.Errorf("verify peak RSS %.1f MiB, over the %d MiB bound", float64(peak)/(1<<20), bound>>20)
			}
		})
	}
}

// watchPeakRSS samples the peak resident memory (VmHWM) of process pid
// until it exits, and returns a function that stops and gives the largest
// sample. VmHWM belongs to the memory the process mapped since its exec:
// the child's rusage Maxrss would not do, because Go starts a child with
// vfork, so the kernel counts the test process's own peak (which grows
// with every test run before) as the child's.
func watchPeakRSS(pid int) func() (int64, bool) {
	var (
		peak int64
		seen bool
	)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, ok := readVmHWM(pid); ok {
				peak, seen = max(peak, v), true
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (int64, bool) {
		close(done)
		<-stopped // the sampler's last write happens before this read
		return peak, seen
	}
}

// readVmHWM reads VmHWM from /proc/pid/status (false once the process is
// gone or where there is no /proc).
func readVmHWM(pid int) (int64, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
