# syntax=docker/dockerfile:1
#
# haia-trace-mcp: a static Go binary in a distroless "nonroot" image.
#
#   podman build --format docker -t localhost/haia-trace-mcp .   # or docker build; docker format keeps HEALTHCHECK
#   podman run -d --read-only -p 127.0.0.1:8080:3000 -v trace:/trace -v haia-config:/etc/haia-trace-mcp
#     -v "$PWD/jwks.json:/run/secrets/jwks.json:ro" localhost/haia-trace-mcp
#     --dir /trace --http-allowed-host 127.0.0.1:8080
#     --auth-issuer https://auth.example --auth-jwks /run/secrets/jwks.json
#
# Why each run flag:
#   --read-only            the image writes nothing outside its volumes; a compromise cannot alter it
#   -p 127.0.0.1:8080:3000 publish on the host's loopback only; a proxy or the host's own agents reach it
#   -v trace:/trace        the Trace root: recorders write events/, the server writes guard/
#   -v haia-config:/etc/…  HAIA_CONFIG_DIR: the signing key is created there on the first start
#   -v …:/run/secrets/…:ro files the server only reads (JWKS, trusted reviewers), read-only
#   --http-allowed-host    the Host clients send through the mapping (127.0.0.1:8080), which is not the
#                          container's 0.0.0.0:3000; without it every request is 403. The token audience
#                          stays the resource URL (--public-url changes both)
#   --ulimit nofile=N:N --ulimit nproc=N:N   only for podman run as root on a host whose hard limits
#                          (ulimit -Hn, ulimit -Hu) are below podman's defaults (1048576 files, 4194304
#                          processes), e.g. podman inside another container: runc cannot raise them and the
#                          container does not start ("error setting rlimit"). Docker (its daemon's limits) and rootless podman (the user's)
#                          keep limits the host allows and need neither.
#
# On a closed network (no registry, no module proxy): vendor the modules, load
# the two base images into the local store, and build with no network at all
# (docs/deployment.md#a-closed-network):
#
#   go mod verify && go mod vendor    # where the module cache is; vendor/ is git-ignored
#   podman load -i base-images.tar    # GO_IMAGE and RUNTIME_IMAGE below, pulled and `podman save`d where the registries are
#   podman build --network=none --pull=never --format docker --build-arg GOFLAGS=-mod=vendor
#     --build-arg GO_IMAGE=docker.io/library/golang:1.26.5
#     --build-arg RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot -t localhost/haia-trace-mcp .
#
# Base images are pinned by tag and digest (the multi-platform index
# digests as published; refresh both together with `crane digest IMAGE:TAG`).
# GO_IMAGE and RUNTIME_IMAGE name them; a build that cannot reach their
# registries passes a local name or a mirror of the same image instead.
ARG GO_IMAGE=docker.io/library/golang:1.26.5@sha256:3aff6657219a4d9c14e27fb1d8976c49c29fddb70ba835014f477e1c70636647
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab

FROM ${GO_IMAGE} AS build
WORKDIR /src
# GOFLAGS=-mod=vendor builds from vendor/ in the context (`go mod vendor`
# first) and downloads nothing; the go command refuses a vendor/ that does
# not match go.mod. Without it the modules are downloaded and verified
# against go.sum.
ARG GOFLAGS=
# Modules first, so a source edit does not re-download them.
COPY go.mod go.sum ./
RUN case " $GOFLAGS " in *" -mod=vendor "*) echo "GOFLAGS=$GOFLAGS: the modules come from vendor/; nothing is downloaded" ;; *) go mod download && go mod verify ;; esac
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

FROM ${RUNTIME_IMAGE}
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
