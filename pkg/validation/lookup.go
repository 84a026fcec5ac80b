package validation

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// GetEnvironment returns the named BuildEnvironment, or nil when name is empty or no
// such environment exists.
func GetEnvironment(ctx context.Context, r client.Reader, namespace, name string) (*bkv1.BuildEnvironment, error) {
	if name == "" {
		return nil, nil
	}
	var env bkv1.BuildEnvironment
	err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &env)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("getting BuildEnvironment %s/%s: %w", namespace, name, err)
	}
	return &env, nil
}
