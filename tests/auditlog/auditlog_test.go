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
