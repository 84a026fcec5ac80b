package certs

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The CA bundle goes, beside the webhook configurations, to ConfigMaps that pods mount to
// trust the operator's serving certificate: warm pods, whose supervisors fetch their jobs
// from the hand-off endpoint served beside the webhooks.
// +kubebuilder:rbac:groups="",namespace=buildkite-jobs,resources=configmaps,verbs=get;create;update

// writeCAConfigMaps writes caBundle into every ConfigMap of cfg.CAConfigMaps under
// KeyCACert, creating the ConfigMap when there is none.
func (m *Manager) writeCAConfigMaps(ctx context.Context, caBundle []byte) error {
	var errs []error
	for _, key := range m.cfg.CAConfigMaps {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cm corev1.ConfigMap
			switch err := m.reader.Get(ctx, key, &cm); {
			case apierrors.IsNotFound(err):
				cm = corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{"app.kubernetes.io/managed-by": "buildkite-operator"}},
					Data:       map[string]string{KeyCACert: string(caBundle)},
				}
				return client.IgnoreAlreadyExists(m.client.Create(ctx, &cm))
			case err != nil:
				return err
			}
			if bytes.Equal([]byte(cm.Data[KeyCACert]), caBundle) {
				return nil
			}
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			cm.Data[KeyCACert] = string(caBundle)
			return m.client.Update(ctx, &cm)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("writing the CA bundle into ConfigMap %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}
