package api_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// The schema of spec.warmPool.maxSize: from size to 20, unset for a pool of always size
// pods, refused below size (a CEL rule) or above 20 before any webhook.
func TestWarmPoolMaxSizeSchema(t *testing.T) {
	ctx := context.Background()
	pool := func(name string, size int32, maxSize *int32) *bkv1.BuildEnvironment {
		e := validEnv(name)
		e.Spec.WarmPool = &bkv1.WarmPool{Size: size, MaxSize: maxSize}
		return e
	}
	n := func(v int32) *int32 { return &v }
	for _, e := range []*bkv1.BuildEnvironment{pool("pool-2-5", 2, n(5)), pool("pool-0-3", 0, n(3)), pool("pool-4-4", 4, n(4)), pool("pool-4", 4, nil)} {
		require.NoError(t, env.Client.Create(ctx, e), e.Name)
		var got bkv1.BuildEnvironment
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(e), &got))
		assert.Equal(t, e.Spec.WarmPool.MaxSize, got.Spec.WarmPool.MaxSize, e.Name)
	}
	for _, tc := range []struct {
		obj  *bkv1.BuildEnvironment
		want string
	}{
		{pool("pool-4-2", 4, n(2)), "warmPool.maxSize must be at least warmPool.size: size is the pool's floor, maxSize its ceiling"},
		{pool("pool-1-21", 1, n(21)), "spec.warmPool.maxSize: Invalid value: 21: spec.warmPool.maxSize in body should be less than or equal to 20"},
	} {
		err := env.Client.Create(ctx, tc.obj)
		require.Error(t, err, tc.obj.Name)
		assert.Contains(t, err.Error(), tc.want)
	}
}
