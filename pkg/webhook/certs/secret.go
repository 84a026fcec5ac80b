package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// bundle is what the Secret holds, parsed.
type bundle struct {
	caCert, prevCA, cert []byte // PEM
	caKey, key           []byte // PEM
	ca, leaf             *x509.Certificate
	caSigner             *ecdsa.PrivateKey
}

func parse(s *corev1.Secret) *bundle {
	if s == nil {
		return nil
	}
	b := &bundle{caCert: s.Data[KeyCACert], caKey: s.Data[KeyCAKey], prevCA: s.Data[KeyPreviousCACert], cert: s.Data[KeyCert], key: s.Data[KeyKey]}
	b.ca = parseCert(b.caCert)
	b.leaf = parseCert(b.cert)
	if blk, _ := pem.Decode(b.caKey); blk != nil {
		if k, err := x509.ParseECPrivateKey(blk.Bytes); err == nil {
			b.caSigner = k
		}
	}
	return b
}

func parseCert(data []byte) *x509.Certificate {
	blk, _ := pem.Decode(data)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil
	}
	return c
}

// secretKey locates the Secret holding the CA and serving certificate.
func (m *Manager) secretKey() client.ObjectKey {
	return client.ObjectKey{Namespace: m.cfg.Namespace, Name: m.cfg.SecretName}
}

// readSecret reads the Secret; exists is false when there is none yet.
func (m *Manager) readSecret(ctx context.Context) (secret corev1.Secret, exists bool, err error) {
	key := m.secretKey()
	switch err := m.reader.Get(ctx, key, &secret); {
	case apierrors.IsNotFound(err):
		return secret, false, nil
	case err != nil:
		return secret, false, fmt.Errorf("reading webhook certificate Secret %s: %w", key, err)
	}
	return secret, true, nil
}

// store writes b into the Secret (secret as read, exists saying whether it was there),
// unless it holds exactly that already.
func (m *Manager) store(ctx context.Context, secret *corev1.Secret, exists bool, b *bundle) error {
	key := m.secretKey()
	data := map[string][]byte{KeyCACert: b.caCert, KeyCAKey: b.caKey, KeyCert: b.cert, KeyKey: b.key}
	if len(b.prevCA) > 0 {
		data[KeyPreviousCACert] = b.prevCA
	}
	switch {
	case !exists:
		*secret = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: m.cfg.Namespace, Name: m.cfg.SecretName,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "buildkite-operator", "app.kubernetes.io/component": "webhook"}},
			Type: corev1.SecretTypeOpaque,
			Data: data,
		}
		if err := m.client.Create(ctx, secret); err != nil {
			return fmt.Errorf("creating webhook certificate Secret %s: %w", key, err)
		}
	case !sameData(secret.Data, data):
		secret.Data = data
		// Update carries the resourceVersion read above: if another writer got there
		// first, this fails and the next pass starts from what it wrote.
		if err := m.client.Update(ctx, secret); err != nil {
			return fmt.Errorf("updating webhook certificate Secret %s: %w", key, err)
		}
	}
	return nil
}

func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}
