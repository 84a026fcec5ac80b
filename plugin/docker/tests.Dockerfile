# The plugin's bats tests: docker-compose run --rm tests
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash bats bats-assert bats-support shellcheck \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /plugin
CMD ["bats", "plugin/tests"]
