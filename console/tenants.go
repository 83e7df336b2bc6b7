package console

import (
	"html/template"
	"net/http"
	"net/url"
)

// tenantsIndex is the page at the root of a console that serves tenants:
// where each tenant's console is. It names no tenant: sessions are per
// tenant (their cookies scoped to the tenant's path), so nobody is signed
// in here, and the tenants a server serves are not told to whoever reaches
// the listener.
var tenantsIndex = template.Must(template.New("tenants").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Reviewer console — choose your tenant</title>
</head>
<body>
<main>
<h1>Reviewer console</h1>
<p>This server keeps one console per tenant, each at its own address:</p>
<p><code>{{.Base}}t/&lt;tenant&gt;/</code></p>
<p>Open the link of a review you were sent (it leads to your tenant's console), or ask the operator for your tenant's console address. You sign in there, with a passkey the operator granted that tenant; a reviewer granted several tenants signs in at each.</p>
<p>The tenants are not listed here: this page knows no one, and tells no one which tenants this server serves.</p>
</main>
</body>
</html>
`))

// TenantsIndex serves the root of a console that serves tenants (u is the
// console URL, ending in /console/): GET of that path is the page that
// says where each tenant's console is; any other path under it that no
// tenant's console serves is 404, saying the same in one line.
func TenantsIndex(u *url.URL) http.Handler {
	base := u.Path
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+base+"{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = tenantsIndex.Execute(w, struct{ Base string }{base})
	})
	mux.HandleFunc(base, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such page: each tenant's console is at "+base+"t/<tenant>/", http.StatusNotFound)
	})
	return secureHeaders(mux, "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'", u.Scheme == "https")
}
