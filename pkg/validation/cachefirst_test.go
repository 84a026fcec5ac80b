package validation_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

func TestCacheFirstGet(t *testing.T) {
	inNS := gen.SetBuildEnvironmentNamespace(admissionNS)
	cached := gen.BuildEnvironment("go", inNS, gen.SetBuildEnvironmentImage("from-cache"))
	stored := gen.BuildEnvironment("go", inNS, gen.SetBuildEnvironmentImage("from-api"))
	fresh := gen.BuildEnvironment("new", inNS, gen.SetBuildEnvironmentImage("from-api"))
	for _, tc := range []struct {
		name      string
		cacheDown bool
		noCache   bool
		env       string
		// wantImage is the image of the environment read ("" when none was found);
		// wantCache and wantAPI how many reads each was asked.
		wantImage          string
		wantCache, wantAPI int
	}{
		{name: "in the cache: the API server is not asked", env: "go", wantImage: "from-cache", wantCache: 1},
		{name: "created a moment ago, not in the cache yet", env: "new", wantImage: "from-api", wantCache: 1, wantAPI: 1},
		{name: "nowhere", env: "gone", wantCache: 1, wantAPI: 1},
		{name: "the cache fails: the API server answers", cacheDown: true, env: "go", wantImage: "from-api", wantCache: 1, wantAPI: 1},
		{name: "no cache", noCache: true, env: "go", wantImage: "from-api", wantAPI: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cacheErr error
			if tc.cacheDown {
				cacheErr = errors.New("cache not started")
			}
			cache, cacheReads := countingReader(t, cacheErr, cached)
			api, apiReads := countingReader(t, nil, stored, fresh)
			r := validation.CacheFirst{Cache: cache, API: api}
			if tc.noCache {
				r.Cache = nil
			}
			env, err := validation.GetEnvironment(context.Background(), r, admissionNS, tc.env)
			require.NoError(t, err)
			if tc.wantImage == "" {
				assert.Nil(t, env)
			} else {
				require.NotNil(t, env)
				assert.Equal(t, tc.wantImage, env.Spec.Image)
			}
			assert.Equal(t, tc.wantCache, cacheReads.of("BuildEnvironment"), "reads of the cache")
			assert.Equal(t, tc.wantAPI, apiReads.of("BuildEnvironment"), "reads of the API server")
		})
	}
}

// The API server's own failure is the caller's to see, not hidden as a missing
// environment.
func TestCacheFirstAPIFails(t *testing.T) {
	down := errors.New("connection refused")
	cache, _ := countingReader(t, nil)
	api, _ := countingReader(t, down)
	_, err := validation.GetEnvironment(context.Background(), validation.CacheFirst{Cache: cache, API: api}, admissionNS, "go")
	require.ErrorIs(t, err, down)
}

// Lists of environments and LimitRanges come from the cache (the API server when it
// fails); a single LimitRange from the API server.
func TestCacheFirstList(t *testing.T) {
	inNS := gen.SetBuildEnvironmentNamespace(admissionNS)
	for _, tc := range []struct {
		name      string
		cacheDown bool
		wantNames []string
		wantLimit string
		wantAPI   int
	}{
		{name: "from the cache", wantNames: []string{"cached"}, wantLimit: "cached-max"},
		{name: "the cache fails", cacheDown: true, wantNames: []string{"stored"}, wantLimit: "max", wantAPI: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cacheErr error
			if tc.cacheDown {
				cacheErr = errors.New("cache not started")
			}
			cache, cacheReads := countingReader(t, cacheErr, gen.BuildEnvironment("cached", inNS),
				&corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "cached-max", Namespace: admissionNS}})
			api, apiReads := countingReader(t, nil, gen.BuildEnvironment("stored", inNS),
				&corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "max", Namespace: admissionNS}})
			r := validation.CacheFirst{Cache: cache, API: api}

			envs, err := validation.ListEnvironments(context.Background(), r, admissionNS)
			require.NoError(t, err)
			var names []string
			for _, e := range envs {
				names = append(names, e.Name)
			}
			assert.Equal(t, tc.wantNames, names)
			assert.Equal(t, tc.wantAPI, apiReads.of("BuildEnvironmentList"))

			var limits corev1.LimitRangeList
			require.NoError(t, r.List(context.Background(), &limits, client.InNamespace(admissionNS)))
			require.Len(t, limits.Items, 1)
			assert.Equal(t, tc.wantLimit, limits.Items[0].Name)
			assert.Equal(t, tc.wantAPI, apiReads.of("LimitRangeList"))

			var lr corev1.LimitRange
			require.NoError(t, r.Get(context.Background(), client.ObjectKey{Namespace: admissionNS, Name: "max"}, &lr))
			assert.Equal(t, 0, cacheReads.of("other"), "a LimitRange asked of the cache")
		})
	}
}
