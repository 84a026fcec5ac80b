# Lints the plugin: shellcheck, plugin.yml against the plugin linter's rules,
# the README's and examples' steps against plugin.yml, and plugin.yml against
# the Go option types: docker-compose run --rm lint
FROM golang:1.26-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends shellcheck \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
CMD ["sh", "-ec", "shellcheck hooks/* plugin/tests/stubs/*; go test -count=1 -run 'TestPluginYAML|TestSchema|TestReadme|TestExample|TestShellcheck' ./plugin/"]
