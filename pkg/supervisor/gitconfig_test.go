package supervisor

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The Command runner's own git settings go after those the pod already gives git through
// GIT_CONFIG_COUNT (a private repository's credential helper), never in their place.
func TestWithGitConfig(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want []string
	}{
		{
			name: "nothing given",
			env:  []string{"HOME=/home/u"},
			want: []string{"HOME=/home/u", "GIT_CONFIG_KEY_0=safe.directory", "GIT_CONFIG_VALUE_0=*", "GIT_CONFIG_COUNT=1"},
		},
		{
			name: "a credential helper from the BuildEnvironment is kept",
			env:  []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=credential.https://git.example.com.helper", "GIT_CONFIG_VALUE_0=!f"},
			want: []string{"GIT_CONFIG_KEY_0=credential.https://git.example.com.helper", "GIT_CONFIG_VALUE_0=!f",
				"GIT_CONFIG_KEY_1=safe.directory", "GIT_CONFIG_VALUE_1=*", "GIT_CONFIG_COUNT=2"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, withGitConfig(tc.env, "safe.directory", "*"))
		})
	}
}
