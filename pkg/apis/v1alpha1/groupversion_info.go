// Package v1alpha1 holds the buildkite-operator API: BuildJob, one Buildkite job run
// as a pod, and BuildEnvironment, the shape of the pods that jobs choosing it get; with
// the names the spawner, the controller and the webhooks must agree on: labels,
// annotations, finalizers, conditions and the job token Secret's name (TokenSecretName).
//
// +kubebuilder:object:generate=true
// +groupName=buildkite-operator.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "buildkite-operator.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
