package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// Go's profiles are served only when asked for, by --pprof-bind-address or its variable,
// on that address; by default neither the metrics nor the probe endpoint serves them, and
// no other address is opened.
func TestPprofEndpoint(t *testing.T) {
	env, err := testenv.Start()
	require.NoError(t, err)
	defer func() { _ = env.Stop() }()
	cases := []struct {
		name string
		// args and env are given the operator besides its metrics and probe addresses;
		// "ADDR" stands for a free address.
		args []string
		env  map[string]string
		on   bool
	}{
		{name: "off by default"},
		{name: "on with the flag", args: []string{"--pprof-bind-address", "ADDR"}, on: true},
		{name: "on with the variable", env: map[string]string{"BK_OPERATOR_PPROF_BIND_ADDRESS": "ADDR"}, on: true},
		{name: "off with 0", args: []string{"--pprof-bind-address", "0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pprofAddr, metricsAddr, probeAddr := freeAddr(t), freeAddr(t), freeAddr(t)
			args := []string{"--leader-elect=false", "--metrics-bind-address", metricsAddr, "--health-probe-bind-address", probeAddr}
			for _, a := range tc.args {
				if a == "ADDR" {
					a = pprofAddr
				}
				args = append(args, a)
			}
			var c operatorConfig
			require.NoError(t, flagenv.ParseEnv(c.flags(), args, func(k string) string {
				if v := tc.env[k]; v != "ADDR" {
					return v
				}
				return pprofAddr
			}))
			mgr, err := c.manager.newManager(env.KubeconfigPath)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- mgr.Start(ctx) }()
			defer func() {
				cancel()
				require.NoError(t, <-done)
			}()
			// The manager starts its servers one by one: both must answer before "nothing
			// answers on the pprof address" or "404 from the metrics address" means anything.
			require.Eventually(t, func() bool {
				code, _ := get(t, "http://"+probeAddr+"/healthz")
				return code == http.StatusOK
			}, 10*time.Second, 50*time.Millisecond, "the probe endpoint never answered")
			require.Eventually(t, func() bool {
				code, _ := get(t, "http://"+metricsAddr+"/metrics")
				return code == http.StatusOK
			}, 10*time.Second, 50*time.Millisecond, "the metrics endpoint never answered")

			for _, addr := range []string{metricsAddr, probeAddr} {
				code, _ := get(t, "http://"+addr+"/debug/pprof/")
				assert.Equal(t, http.StatusNotFound, code, "%s serves /debug/pprof/", addr)
			}
			code, body := get(t, "http://"+pprofAddr+"/debug/pprof/goroutine?debug=1")
			if !tc.on {
				assert.Contains(t, []string{"", "0"}, c.manager.pprofAddr, "the profiles are served")
				assert.Zero(t, code, "%s answered %d", pprofAddr, code)
				return
			}
			require.Eventually(t, func() bool {
				code, body = get(t, "http://"+pprofAddr+"/debug/pprof/goroutine?debug=1")
				return code == http.StatusOK
			}, 10*time.Second, 50*time.Millisecond, "the profiles were never served on %s", pprofAddr)
			assert.Contains(t, body, "goroutine profile:")
			code, body = get(t, "http://"+pprofAddr+"/debug/pprof/heap?debug=1")
			assert.Equal(t, http.StatusOK, code)
			assert.Contains(t, body, "heap profile:")
		})
	}
}

// get returns the status and body of a GET of url, 0 when nothing answered.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, ""
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
