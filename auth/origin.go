package auth

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// OriginGuard protects against DNS rebinding: the Host header must be one of
// allowedHosts (host:port, compared case-insensitively) and an Origin header,
// when present, one of allowedOrigins (scheme://host[:port]). Anything else
// gets 403 before reaching next, with a body that names the values allowed
// and hint (how the operator sets them, e.g. which flag). Empty lists allow
// nothing; requests without an Origin (non-browser clients) pass the Origin
// check.
func OriginGuard(allowedHosts, allowedOrigins []string, hint string, next http.Handler) http.Handler {
	hosts := lowerSet(allowedHosts)
	origins := lowerSet(allowedOrigins)
	suffix := ""
	if hint != "" {
		suffix = "; " + hint
	}
	hostList := strings.Join(allowedHosts, ", ")
	originList := strings.Join(allowedOrigins, ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hosts[strings.ToLower(r.Host)] {
			http.Error(w, fmt.Sprintf("forbidden: Host %s is not allowed; this server answers to Host %s%s",
				quoteClipped(r.Host), hostList, suffix), http.StatusForbidden)
			return
		}
		vals := r.Header.Values("Origin")
		if len(vals) > 1 {
			http.Error(w, "forbidden: more than one Origin header", http.StatusForbidden)
			return
		}
		if len(vals) == 1 && !origins[strings.ToLower(strings.TrimSuffix(vals[0], "/"))] {
			http.Error(w, fmt.Sprintf("forbidden: Origin %s is not allowed; allowed are %s%s",
				quoteClipped(vals[0]), originList, suffix), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// quoteClipped quotes a client's header value for an error body: Go-quoted
// (no control character reaches a terminal) and at most 100 bytes of it.
func quoteClipped(v string) string {
	const max = 100
	if len(v) > max {
		return strconv.Quote(v[:max]) + "…"
	}
	return strconv.Quote(v)
}

func lowerSet(in []string) map[string]bool {
	m := make(map[string]bool, len(in))
	for _, s := range in {
		m[strings.ToLower(strings.TrimSuffix(s, "/"))] = true
	}
	return m
}

// LoopbackHosts lists the Host values a loopback listener on port answers to.
func LoopbackHosts(port string) []string {
	return []string{
		net.JoinHostPort("127.0.0.1", port),
		net.JoinHostPort("localhost", port),
		net.JoinHostPort("::1", port),
	}
}

// OriginsFor lists the http and https origins of the given host:port values,
// the browser origins that may call a server known by those hosts.
func OriginsFor(hosts []string) []string {
	out := make([]string, 0, 2*len(hosts))
	for _, h := range hosts {
		out = append(out, "http://"+h, "https://"+h)
	}
	return out
}
