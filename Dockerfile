# One image, two binaries: /egressip-controller (Deployment) and
# /egressip-agent (DaemonSet). The manifests pick the binary with `command`.
# Override BASE_IMAGE to build from another registry, e.g. docker.io/library/golang:1.26
ARG BASE_IMAGE=golang:1.26
FROM ${BASE_IMAGE} AS builder
ARG TARGETOS
ARG TARGETARCH

WORKDIR /workspace
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download

COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/

# Static binaries (distroless/static has no libc). TARGETARCH is left empty
# by a plain `docker build`, which builds for the host.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /out/egressip-controller ./cmd/controller && \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /out/egressip-agent ./cmd/agent && \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /out/egressip-agent-probe ./cmd/agent-probe && \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /out/egressip-cni ./cmd/cni

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /out/egressip-controller /out/egressip-agent /out/egressip-agent-probe /out/egressip-cni /
# The controller runs as this user. The agent's DaemonSet overrides it with
# runAsUser: 0 and only CAP_NET_ADMIN and CAP_NET_RAW (see docs/security.md).
USER 65532:65532
ENTRYPOINT ["/egressip-controller"]
