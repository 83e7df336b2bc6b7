package auth

import (
	"net"
	"net/http"
	"strings"
)

// OriginGuard protects against DNS rebinding: the Host header must be one of
// allowedHosts (host:port, compared case-insensitively) and an Origin header,
// when present, one of allowedOrigins (scheme://host[:port]). Anything else
// gets 403 before reaching next. Empty lists allow nothing; requests without
// an Origin (non-browser clients) pass the Origin check.
func OriginGuard(allowedHosts, allowedOrigins []string, next http.Handler) http.Handler {
	hosts := lowerSet(allowedHosts)
	origins := lowerSet(allowedOrigins)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hosts[strings.ToLower(r.Host)] {
			http.Error(w, "forbidden: Host header not allowed", http.StatusForbidden)
			return
		}
		vals := r.Header.Values("Origin")
		if len(vals) > 1 {
			http.Error(w, "forbidden: more than one Origin header", http.StatusForbidden)
			return
		}
		if len(vals) == 1 && !origins[strings.ToLower(strings.TrimSuffix(vals[0], "/"))] {
			http.Error(w, "forbidden: Origin not allowed", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
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
