package podbuilder

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/validation/validationtest"
)

// An environment that uses a privilege it does not allow (one admitted while the webhook
// was off, or from before the rule) gets no pod: Build refuses it, saying what and how to
// fix it, and builds it once the environment allows the privilege.
func TestBuildRefusesPrivilegesNotAllowed(t *testing.T) {
	for _, tc := range validationtest.PrivilegeCases() {
		t.Run(tc.Name, func(t *testing.T) {
			env := baseEnv()
			tc.Set(env)
			_, err := Build(baseJob(), env, Options{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), `BuildEnvironment "go" uses privileges it does not allow`)
			assert.Contains(t, err.Error(), tc.Want)

			tc.Allow(&env.Spec.Allow)
			_, err = Build(baseJob(), env, Options{})
			assert.NoError(t, err)
		})
	}
}
