# syntax=docker/dockerfile:1
#
# haia-trace-mcp: a static Go binary in a distroless "nonroot" image.
#
#   docker build -t haia-trace-mcp .
#   docker run --read-only -p 127.0.0.1:3000:3000 -v trace:/trace ... haia-trace-mcp \
#     --dir /trace --auth-issuer https://auth.example --auth-jwks /etc/haia-trace-mcp/jwks.json
#
# Base images are pinned by tag and digest (the multi-platform index
# digests as published; refresh both together with `crane digest IMAGE:TAG`).

FROM docker.io/library/golang:1.26.5@sha256:3aff6657219a4d9c14e27fb1d8976c49c29fddb70ba835014f477e1c70636647 AS build
WORKDIR /src
# Modules first, so a source edit does not re-download them.
COPY go.mod go.sum ./
RUN go mod download && go mod verify
COPY . .
# -buildvcs=auto stamps the revision into the build info (read by
# `haia-trace-mcp version`) when .git is in the build context, and builds
# without it otherwise.
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=auto -ldflags "-s -w" \
        -o /out/haia-trace-mcp ./cmd/haia-trace-mcp
# The mount points, owned by the image's non-root user, so that a fresh named
# volume mounted on them starts with the right owner (the image has no shell
# to create them later). events/ is written by recorders, never by the server.
# /etc/haia-trace-mcp is HAIA_CONFIG_DIR (default keys, reviewer files): private.
RUN mkdir -p /out/trace/events /out/trace/guard /out/run/haia-signer /out/etc/haia-trace-mcp && chmod 0700 /out/etc/haia-trace-mcp

FROM gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
COPY --from=build /out/haia-trace-mcp /haia-trace-mcp
COPY --from=build --chown=65532:65532 /out/trace /trace
COPY --from=build --chown=65532:65532 /out/run/haia-signer /run/haia-signer
COPY --from=build --chown=65532:65532 /out/etc/haia-trace-mcp /etc/haia-trace-mcp
# The container has no HOME (the runtime sets HOME=/), so the default key
# paths (--key-file, --params-key-file) and reviewer files live here: mount a
# secret or a volume on /etc/haia-trace-mcp, or pass every path by flag. On a
# read-only root with nothing mounted, a default key cannot be created and
# the server says which flag to pass.
ENV HAIA_CONFIG_DIR=/etc/haia-trace-mcp
# uid/gid 65532 is distroless's "nonroot"; numeric so that runAsNonRoot can
# check it without reading /etc/passwd.
USER 65532:65532
# The Trace root: recorders write events/, the server writes only guard/.
# Nothing else is written, so the container runs with a read-only root
# filesystem and needs no /tmp.
VOLUME ["/trace"]
EXPOSE 3000
# Exec form: the image has no shell. /healthz answers while the process lives.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/haia-trace-mcp", "healthcheck", "--url", "http://127.0.0.1:3000/healthz"]
# Serve Streamable HTTP on every interface of the container; the port is only
# reachable where the operator publishes it. For the CLI (review, verify, ...)
# override the entrypoint: docker run --entrypoint /haia-trace-mcp IMAGE review list --dir /trace
ENTRYPOINT ["/haia-trace-mcp", "--http", "0.0.0.0:3000", "--http-allow-remote"]
# Defaults an operator adds to (OAuth issuer and JWKS are required over HTTP).
CMD ["--dir", "/trace", "--log-level", "info"]
