package console

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// The root of a console that serves tenants says where each tenant's
// console is, names no tenant, and carries the console's headers; any
// other path under it is 404.
func TestTenantsIndex(t *testing.T) {
	for _, base := range []string{"http://localhost:8787/console/", "https://reviews.example.com/ops/console/"} {
		u, err := ParseURL(base)
		if err != nil {
			t.Fatal(err)
		}
		h := TenantsIndex(u)
		for _, tc := range []struct {
			method, path string
			code         int
			want         string
		}{
			{"GET", u.Path, 200, "<code>" + u.Path + "t/&lt;tenant&gt;/</code>"},
			{"HEAD", u.Path, 200, ""},
			{"GET", u.Path + "t/acme/", 404, "each tenant's console is at " + u.Path + "t/<tenant>/"},
			{"GET", u.Path + "reviews/r1", 404, "no such page"},
			{"POST", u.Path, 404, "no such page"},
		} {
			t.Run(base+" "+tc.method+" "+tc.path, func(t *testing.T) {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(tc.method, (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: tc.path}).String(), nil))
				body := rec.Body.String()
				if rec.Code != tc.code || !strings.Contains(body, tc.want) {
					t.Fatalf("%d %q; want %d containing %q", rec.Code, body, tc.code, tc.want)
				}
				hd := rec.Header()
				if !strings.Contains(hd.Get("Content-Security-Policy"), "default-src 'none'") || hd.Get("X-Frame-Options") != "DENY" || hd.Get("Cache-Control") != "no-store" {
					t.Fatalf("headers %v", hd)
				}
				if (u.Scheme == "https") != (hd.Get("Strict-Transport-Security") != "") {
					t.Fatalf("Strict-Transport-Security %q over %s", hd.Get("Strict-Transport-Security"), u.Scheme)
				}
				if tc.code == http.StatusOK && strings.Contains(body, "<script") {
					t.Fatal("the index page carries a script")
				}
			})
		}
	}
}
