package cluster

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHostsLine(t *testing.T) {
	cases := []struct {
		name      string
		hosts     string
		host      string
		hasLine   bool
		afterDown string
	}{
		{name: "mapped already", hosts: "127.0.0.1 localhost\n127.0.0.1 vm\n", host: "vm", hasLine: true},
		{name: "mapped among aliases, any case", hosts: "127.0.0.1\tlocalhost VM other\n", host: "vm", hasLine: true},
		{name: "mapped to another address only", hosts: "127.0.0.1 localhost\n10.0.0.5 vm\n", host: "vm"},
		{name: "a commented mapping does not count", hosts: "# 127.0.0.1 vm\n", host: "vm"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hostsFile = filepath.Join(t.TempDir(), "hosts")
			t.Cleanup(func() { hostsFile = "/etc/hosts" })
			require.NoError(t, os.WriteFile(hostsFile, []byte(tc.hosts), 0o644))
			assert.Equal(t, tc.hasLine, hostsHasLoopbackName(tc.host))
			if tc.hasLine {
				return
			}
			line := "127.0.0.1 " + tc.host + " # localnode"
			require.NoError(t, appendHostsLine(line))
			assert.True(t, hostsHasLoopbackName(tc.host))
			// Someone else edits the file while the node runs: their line stays.
			f, err := os.OpenFile(hostsFile, os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteString("10.1.1.1 added-later\n")
			require.NoError(t, err)
			require.NoError(t, f.Close())

			require.NoError(t, removeHostsLine(line))
			got, err := os.ReadFile(hostsFile)
			require.NoError(t, err)
			assert.Equal(t, tc.hosts+"10.1.1.1 added-later\n", string(got))
			// A second removal (Down retried) changes nothing.
			require.NoError(t, removeHostsLine(line))
			again, err := os.ReadFile(hostsFile)
			require.NoError(t, err)
			assert.Equal(t, string(got), string(again))
		})
	}
}

func TestOwnedChain(t *testing.T) {
	cases := map[string]bool{"KUBE-FIREWALL": true, "KUBE-KUBELET-CANARY": true, "CNI-FORWARD": true, "DOCKER": false, "INPUT": false, "MY-KUBE-X": false}
	for name, want := range cases {
		assert.Equal(t, want, ownedChain(name), name)
	}
}

func TestMachineLockSerialisesNodes(t *testing.T) {
	lockPath = filepath.Join(t.TempDir(), "lock")
	t.Cleanup(func() { lockPath = filepath.Join(os.TempDir(), "bk-operator-localnode.lock") })
	first, err := machineLock(context.Background(), t.Logf)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = machineLock(ctx, t.Logf)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a second node waits while the first holds the lock")

	released := make(chan error, 1)
	go func() {
		f, err := machineLock(context.Background(), t.Logf)
		if err == nil {
			_ = f.Close()
		}
		released <- err
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, first.Close())
	select {
	case err := <-released:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting node did not get the lock after the first released it")
	}
}

func TestRuleFields(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{`-A KUBE-FORWARD -j DROP`, []string{"-A", "KUBE-FORWARD", "-j", "DROP"}},
		{`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			[]string{"-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}},
		{`-A X -m comment --comment "say \"hi\"" -j Y`, []string{"-A", "X", "-m", "comment", "--comment", `say "hi"`, "-j", "Y"}},
		{`-A X -m comment --comment "" -j Y`, []string{"-A", "X", "-m", "comment", "--comment", "", "-j", "Y"}},
		{``, nil},
	} {
		assert.Equal(t, tc.want, ruleFields(tc.line), tc.line)
	}
}
