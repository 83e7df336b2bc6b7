package auth

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Metadata is the RFC 9728 protected-resource metadata document.
type Metadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported,omitempty"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
}

// MetadataFor builds the metadata of a configuration: its resource, its
// issuer, every scope it may ask for, and the header as the only bearer method.
func MetadataFor(cfg Config) (Metadata, error) {
	if _, err := metadataURL(cfg.Resource); err != nil {
		return Metadata{}, err
	}
	if cfg.Issuer == "" {
		return Metadata{}, fmt.Errorf("protected-resource metadata needs an issuer")
	}
	return Metadata{
		Resource:               cfg.Resource,
		AuthorizationServers:   []string{cfg.Issuer},
		ScopesSupported:        cfg.scopesSupported(),
		BearerMethodsSupported: []string{"header"},
	}, nil
}

// MetadataHandler serves the metadata of cfg as JSON to GET and HEAD. Mount
// it at MetadataPath(cfg.Resource) and at the root form WellKnownPrefix.
// The document is public, so any origin may read it.
func MetadataHandler(cfg Config) (http.Handler, error) {
	md, err := MetadataFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("metadata handler: %w", err)
	}
	body, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("metadata handler: encode: %w", err)
	}
	body = append(body, '\n')
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Header().Set("Cache-Control", "max-age=300")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(body)
	}), nil
}

// MetadataHandler serves the metadata of the verifier's configuration.
func (v *Verifier) MetadataHandler() http.Handler {
	h, err := MetadataHandler(v.cfg)
	if err != nil {
		// New already validated resource and issuer, so this cannot happen;
		// answer 500 rather than panic if it ever does.
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "metadata unavailable", http.StatusInternalServerError)
		})
	}
	return h
}
