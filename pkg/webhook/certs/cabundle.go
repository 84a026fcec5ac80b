package certs

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// patchCABundle writes caBundle into every webhook of the named configurations. A name
// with no configuration of either kind is an error (the manifests are not applied yet);
// the other names are still patched.
func (m *Manager) patchCABundle(ctx context.Context, caBundle []byte) error {
	var errs []error
	for _, name := range m.cfg.WebhookConfigNames {
		var v admissionv1.ValidatingWebhookConfiguration
		foundV, err := m.injectCABundle(ctx, name, &v, func() []*admissionv1.WebhookClientConfig {
			cfgs := make([]*admissionv1.WebhookClientConfig, len(v.Webhooks))
			for i := range v.Webhooks {
				cfgs[i] = &v.Webhooks[i].ClientConfig
			}
			return cfgs
		}, caBundle)
		if err != nil {
			errs = append(errs, fmt.Errorf("writing caBundle into ValidatingWebhookConfiguration %q: %w", name, err))
		}
		var mw admissionv1.MutatingWebhookConfiguration
		foundM, err := m.injectCABundle(ctx, name, &mw, func() []*admissionv1.WebhookClientConfig {
			cfgs := make([]*admissionv1.WebhookClientConfig, len(mw.Webhooks))
			for i := range mw.Webhooks {
				cfgs[i] = &mw.Webhooks[i].ClientConfig
			}
			return cfgs
		}, caBundle)
		if err != nil {
			errs = append(errs, fmt.Errorf("writing caBundle into MutatingWebhookConfiguration %q: %w", name, err))
		}
		found := foundV || foundM
		if !found && len(errs) == 0 {
			errs = append(errs, fmt.Errorf("no Validating or MutatingWebhookConfiguration named %q: install the Helm chart (charts/buildkite-operator) or deploy/install.yaml, whose configurations are named <fullname>-<release namespace>, and give the operator that name (--webhook-configuration-name)", name))
		}
	}
	return errors.Join(errs...)
}

// injectCABundle writes caBundle into every client config of the webhook configuration
// named name (obj, read afresh on each conflict retry; configs lists its client configs).
// found is false when no such configuration exists.
func (m *Manager) injectCABundle(ctx context.Context, name string, obj client.Object, configs func() []*admissionv1.WebhookClientConfig, caBundle []byte) (found bool, err error) {
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		switch err := m.reader.Get(ctx, client.ObjectKey{Name: name}, obj); {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		found = true
		changed := false
		for _, cc := range configs() {
			if !bytes.Equal(cc.CABundle, caBundle) {
				cc.CABundle = caBundle
				changed = true
			}
		}
		if !changed {
			return nil
		}
		return m.client.Update(ctx, obj)
	})
	return found, err
}
