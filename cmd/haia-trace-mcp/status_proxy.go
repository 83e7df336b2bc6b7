package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/proxy"
)

// statusProxy is what a guard proxy serving this root last wrote of its
// upstream's tools (guard/proxy-tools.json); absent when no proxy has.
type statusProxy struct {
	File  string            `json:"file"`
	Error string            `json:"error,omitempty"`
	State *proxy.ToolsState `json:"state,omitempty"`
}

// proxyStatusOf reads the proxy's tool state under root, and the problems
// it shows: a tool refused as new, an unmapped tool that looks like a
// payment and is forwarded unchecked, a proxy refusing every call.
func proxyStatusOf(root *confined.Dir) (*statusProxy, []string) {
	file := "guard/" + proxy.ToolsStateFile
	sp := &statusProxy{File: file}
	dir, err := root.OpenDir("guard")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var data []byte
	if err == nil {
		data, err = fs.ReadFile(dir.FS(proxy.MaxToolsStateBytes), proxy.ToolsStateFile)
		dir.Close()
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	if err == nil {
		sp.State, err = proxy.ReadToolsState(data)
	}
	if err != nil {
		sp.Error = err.Error()
		return sp, []string{fmt.Sprintf("the guard proxy's tool state %s cannot be read: %v", file, err)}
	}
	var probs []string
	st := sp.State
	if st.Broken != "" {
		probs = append(probs, "the guard proxy refuses every upstream call: "+st.Broken)
	}
	for _, t := range st.Tools {
		looks := ""
		if t.PaymentLike != "" {
			looks = "; it looks like a payment: " + t.PaymentLike
		}
		switch {
		case t.Status == proxy.ToolRefusedNew:
			probs = append(probs, fmt.Sprintf("the upstream tool %s appeared (or its input schema changed) after the guard map was read, at %s, and the proxy refuses it until the map names it or is re-read (SIGHUP)%s", t.Name, t.NewSince, looks))
		case (t.Status == proxy.ToolForwarded || t.Status == proxy.ToolForwardedNew) && t.PaymentLike != "":
			probs = append(probs, fmt.Sprintf("the upstream tool %s is not in the guard map and the proxy forwards it unchecked%s: map it as paying, or set \"unmapped\": \"refuse\"", t.Name, looks))
		}
	}
	return sp, probs
}

// proxyStatusWords says in words what the proxy does with an unmapped tool.
var proxyStatusWords = map[string]string{
	proxy.ToolForwarded:       "forwarded unchecked",
	proxy.ToolForwardedNew:    "forwarded unchecked, new since %s (newTools: forward)",
	proxy.ToolRefusedUnmapped: "refused (unmapped: refuse)",
	proxy.ToolRefusedNew:      "refused: new since %s, until the map names it or is re-read (SIGHUP)",
}

func printStatusProxy(w io.Writer, sp *statusProxy) {
	s := termsafe.String
	if sp == nil {
		return
	}
	if sp.State == nil {
		fmt.Fprintf(w, "proxy       %s cannot be read: %s\n", s(sp.File), s(sp.Error))
		return
	}
	st := sp.State
	fmt.Fprintf(w, "proxy       as the guard proxy (pid %d) wrote it at %s: upstream %s\n", st.PID, s(st.WrittenAt), s(st.Upstream))
	fmt.Fprintf(w, "            guard map %s, read at %s (unmapped: %s, newTools: %s)\n", s(st.MapFile), s(st.MapReadAt), s(st.Unmapped), s(st.NewTools))
	if st.Broken != "" {
		fmt.Fprintf(w, "            every upstream call is refused: %s\n", s(st.Broken))
	}
	paying, unmapped := 0, st.UnmappedTools()
	refused := 0
	for _, t := range st.Tools {
		switch t.Status {
		case proxy.ToolPaying:
			paying++
		case proxy.ToolRefusedNew, proxy.ToolRefusedUnmapped:
			refused++
		}
	}
	fmt.Fprintf(w, "            %s: %d paying (in the guard map), %d not in it (%d refused)\n", plural(len(st.Tools), "upstream tool", "upstream tools"), paying, len(unmapped), refused)
	width := 0
	for _, t := range unmapped {
		width = max(width, len(s(t.Name)))
	}
	for _, t := range unmapped {
		what := proxyStatusWords[t.Status]
		if strings.Contains(what, "%s") {
			what = fmt.Sprintf(what, s(t.NewSince))
		}
		fmt.Fprintf(w, "              %-*s  %s\n", width, s(t.Name), what)
		if t.PaymentLike != "" {
			fmt.Fprintf(w, "              %-*s  looks like a payment: %s\n", width, "", s(t.PaymentLike))
		}
	}
}

// plural writes "1 tool" or "3 tools".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
