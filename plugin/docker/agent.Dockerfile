# A local buildkite-agent (v3.52.0, as the operator's job images use) and the
# project's fake Buildkite agent API: docker-compose up agent
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/fake-buildkite ./tests/fakebuildkite/cmd/fake-buildkite
RUN mkdir -p /tmp/agent \
 && cd /tmp/agent \
 && GOBIN=/tmp/agent/bin GOFLAGS=-mod=mod CGO_ENABLED=0 go install github.com/buildkite/agent/v3@v3.52.0 \
 && mv /tmp/agent/bin/agent /out/buildkite-agent

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash ca-certificates git openssh-client \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
# The agent trusts only its own checkouts; the mounted working tree is owned by someone else.
RUN git config --system --add safe.directory '*'
