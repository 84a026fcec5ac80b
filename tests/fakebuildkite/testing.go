package fakebuildkite

import "testing"

// StartForTest starts a fake that logs to t and closes when the test ends.
func StartForTest(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	s, err := Start(opts)
	if err != nil {
		t.Fatalf("start the fake Buildkite: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
