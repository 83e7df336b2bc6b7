// Package auth makes the HTTP transport an OAuth 2.1 resource server.
//
// It verifies JWT access tokens locally (a JWKS file for RS256/ES256, or an
// HS256 secret file for a local authorization server), answers RFC 6750
// bearer challenges that point at the RFC 9728 protected-resource metadata,
// enforces per-tool scopes on MCP tools/call requests, and guards against DNS
// rebinding. It never makes a network call: keys come only from files the
// operator provides.
package auth
