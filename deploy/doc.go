// Package deploy holds the container and orchestration files of
// haia-trace-mcp (compose.yaml, kubernetes/*.yaml, the guard policy example)
// and, in its tests, their offline validation: strict decoding into the
// Kubernetes API types and a compose struct, the security properties the
// deployment docs promise (docs/deployment.md), and that every flag they
// pass to the binary exists.
package deploy
