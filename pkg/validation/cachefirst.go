package validation

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// CacheFirst is a client.Reader that reads BuildEnvironments from Cache, and from API
// when Cache cannot give one: the informer may not have seen an environment created a
// moment ago, and a job must not fail for that. It lists LimitRanges from Cache too (API
// when Cache fails): a LimitRange made a moment ago may be missed for that moment, which
// costs nothing, as the API server's own LimitRanger still applies it to the job's pod;
// listing them from the API server was one request per job. Anything else it reads from
// API. A nil Cache reads everything from API.
//
// The spawner reads a job's environment through it when it admits the job, and the
// controller when it builds the job's pod: on the hot path both cost no request to the
// API server, and neither reports an environment missing that exists.
type CacheFirst struct {
	Cache, API client.Reader
}

var _ client.Reader = CacheFirst{}

// Get reads a BuildEnvironment from Cache, then, should Cache not have it or fail, from
// API; any other object from API.
func (c CacheFirst) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*bkv1.BuildEnvironment); ok && c.Cache != nil {
		if err := c.Cache.Get(ctx, key, obj, opts...); err == nil {
			return nil
		}
	}
	return c.API.Get(ctx, key, obj, opts...)
}

// List lists BuildEnvironments and LimitRanges from Cache, then, should Cache fail, from
// API; any other kind from API.
func (c CacheFirst) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	switch list.(type) {
	case *bkv1.BuildEnvironmentList, *corev1.LimitRangeList:
	default:
		return c.API.List(ctx, list, opts...)
	}
	if c.Cache != nil {
		if err := c.Cache.List(ctx, list, opts...); err == nil {
			return nil
		}
	}
	return c.API.List(ctx, list, opts...)
}
