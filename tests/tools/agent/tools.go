//go:build tools

// Package agent pins the real buildkite-agent that the tests run and the images carry,
// so that `go mod tidy` keeps everything it needs.
package agent

import (
	_ "github.com/buildkite/agent/v3"
)
