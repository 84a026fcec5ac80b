package auditlog

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEachAndResource(t *testing.T) {
	log := `{"auditID":"1","verb":"update","user":{"username":"system:serviceaccount:buildkite:op"},"objectRef":{"resource":"buildjobs","subresource":"status","apiGroup":"buildkite-operator.dev"},"responseStatus":{"code":200},"requestURI":"/apis/x"}
{"auditID":"2","verb":"get","user":{"username":"kubelet"},"requestURI":"/healthz?verbose=1"}
{"auditID":"3","verb":"list","user":{"username":"op"},"objectRef":{"resource":"pods"},"responseStatus":{"code":403}}
`
	var got []string
	require.NoError(t, Each(strings.NewReader(log), func(e *Event) error {
		got = append(got, e.AuditID+" "+e.Verb+" "+e.Resource())
		return nil
	}))
	assert.Equal(t, []string{"1 update buildjobs/status", "2 get /healthz", "3 list pods"}, got)

	stop := errors.New("stop")
	n := 0
	err := Each(strings.NewReader(log), func(*Event) error { n++; return stop })
	assert.ErrorIs(t, err, stop)
	assert.Equal(t, 1, n, "Each stops at fn's first error")

	assert.ErrorContains(t, Each(strings.NewReader("{not json\n"), func(*Event) error { return nil }), "reading an audit event")
}

// A 403 is a refusal of the operator's RBAC only when the authorizer forbade it: an exceeded
// ResourceQuota or Pod Security also answer 403, after the authorizer allowed the request.
func TestForbiddenByRBAC(t *testing.T) {
	cases := []struct {
		name, event string
		want        bool
	}{
		{"authorizer forbade", `{"responseStatus":{"code":403},"annotations":{"authorization.k8s.io/decision":"forbid"}}`, true},
		{"quota refused", `{"responseStatus":{"code":403,"message":"exceeded quota"},"annotations":{"authorization.k8s.io/decision":"allow"}}`, false},
		{"allowed", `{"responseStatus":{"code":200},"annotations":{"authorization.k8s.io/decision":"allow"}}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, Each(strings.NewReader(tc.event+"\n"), func(e *Event) error {
				assert.Equal(t, tc.want, e.ForbiddenByRBAC())
				return nil
			}))
		})
	}
}
