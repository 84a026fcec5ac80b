// Package jobpolicytest makes what tests of signed pipelines need: signing keys and their
// public key sets, as `buildkite-agent tool keygen` makes them, and pipelines signed as
// `buildkite-agent pipeline upload --jwks-file` signs them.
package jobpolicytest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/buildkite/go-pipeline"
	"github.com/buildkite/go-pipeline/signature"
	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/stretchr/testify/require"
)

// NewKey makes a signing key (ECDSA P-256, ES256) with key id kid.
func NewKey(t testing.TB, kid string) jwk.Key {
	t.Helper()
	raw, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	key, err := jwk.Import(raw)
	require.NoError(t, err)
	require.NoError(t, key.Set(jwk.KeyIDKey, kid))
	require.NoError(t, key.Set(jwk.AlgorithmKey, jwa.ES256()))
	return key
}

// KeySet is the JSON Web Key Set of the public halves of keys: what a platform team gives
// --verification-jwks-file.
func KeySet(t testing.TB, keys ...jwk.Key) []byte {
	t.Helper()
	set := jwk.NewSet()
	for _, k := range keys {
		pub, err := k.PublicKey()
		require.NoError(t, err)
		require.NoError(t, set.AddKey(pub))
	}
	b, err := json.Marshal(set)
	require.NoError(t, err)
	return b
}

// WriteKeySet writes KeySet(keys...) to a file of the test's and returns its path.
func WriteKeySet(t testing.TB, keys ...jwk.Key) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "jwks.json")
	require.NoError(t, os.WriteFile(p, KeySet(t, keys...), 0o600))
	return p
}

// Sign parses a pipeline and signs its steps with key for the repository repoURL, over the
// pipeline's env as the upload does; a nil key leaves them unsigned. Marshalled as JSON, the
// result is an upload Buildkite (and the fake) read as YAML.
func Sign(t testing.TB, yaml string, key jwk.Key, repoURL string) *pipeline.Pipeline {
	t.Helper()
	p, err := pipeline.Parse(strings.NewReader(yaml))
	require.NoError(t, err)
	if key == nil {
		return p
	}
	var env map[string]string
	if p.Env != nil {
		env = p.Env.ToMap()
	}
	require.NoError(t, signature.SignSteps(context.Background(), p.Steps, key, repoURL, signature.WithEnv(env)))
	return p
}
