// Package certs keeps the admission webhook's TLS in order without cert-manager: a
// self-signed CA and a serving certificate for the webhook Service, stored in a Secret,
// renewed before they expire, with the CA bundle written into the webhook
// configurations and the serving certificate handed to the TLS server in memory (a
// GetCertificate hook), so that a renewal needs no restart and no file juggling.
//
// Two loops share the work. The rotator (leader only, so that replicas never race to
// mint different CAs) creates and renews the Secret and patches caBundle. The loader
// (every replica) reads the Secret and serves what it holds.
package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys of the Secret. ca.crt, tls.crt and tls.key are the names cert-manager and
// kubernetes.io/tls Secrets use, so tools that read those understand this one too.
const (
	KeyCACert         = "ca.crt"
	KeyCAKey          = "ca.key"
	KeyPreviousCACert = "ca-previous.crt"
	KeyCert           = corev1.TLSCertKey
	KeyKey            = corev1.TLSPrivateKeyKey
)

// Defaults for Config.
const (
	DefaultCertValidity = 365 * 24 * time.Hour
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultRotateBefore = 30 * 24 * time.Hour
	DefaultSyncInterval = time.Minute
)

// Config says what to certify and where to keep it.
type Config struct {
	// Namespace and SecretName locate the Secret holding the CA and serving certificate.
	Namespace  string
	SecretName string
	// Hosts are the names (and IP addresses) the serving certificate is valid for:
	// the webhook Service's DNS names, and anything else the API server dials.
	Hosts []string
	// WebhookConfigNames are Validating and MutatingWebhookConfigurations whose every
	// webhook gets the CA bundle.
	WebhookConfigNames []string
	// CAConfigMaps get the CA bundle too, under KeyCACert, for pods that reach the
	// operator's server (the warm pods' hand-off endpoint).
	CAConfigMaps []types.NamespacedName
	// CertValidity is how long a serving certificate is valid; CAValidity the CA's.
	CertValidity time.Duration
	CAValidity   time.Duration
	// RotateBefore is how long before expiry a certificate is replaced.
	RotateBefore time.Duration
	// SyncInterval is how often the Secret and the caBundle are checked even when
	// nothing is due, which repairs a caBundle reset by re-applying the manifests.
	SyncInterval time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	if c.CertValidity == 0 {
		c.CertValidity = DefaultCertValidity
	}
	if c.CAValidity == 0 {
		c.CAValidity = DefaultCAValidity
	}
	if c.RotateBefore == 0 {
		c.RotateBefore = DefaultRotateBefore
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = DefaultSyncInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case c.Namespace == "" || c.SecretName == "":
		return fmt.Errorf("webhook certificates: the Secret's namespace and name are required")
	case len(c.Hosts) == 0:
		return fmt.Errorf("webhook certificates: at least one host name is required")
	case c.RotateBefore >= c.CertValidity || c.RotateBefore >= c.CAValidity:
		return fmt.Errorf("webhook certificates: the rotation margin (%s) must be shorter than the certificate validity (%s) and the CA validity (%s)",
			c.RotateBefore, c.CertValidity, c.CAValidity)
	}
	return nil
}

// Manager mints, renews and serves the webhook's certificates.
type Manager struct {
	cfg    Config
	client client.Client
	reader client.Reader
	log    logr.Logger

	served atomic.Pointer[tls.Certificate]
	// mu serialises Ensure, so the rotator and a test calling it never interleave.
	mu sync.Mutex
}

// New returns a Manager that writes with c and reads with r (an uncached reader, so that
// it needs no cluster-wide watch on Secrets).
func New(c client.Client, r client.Reader, cfg Config, log logr.Logger) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Manager{cfg: cfg, client: c, reader: r, log: log}, nil
}

// GetCertificate is the TLS server's hook: it returns the certificate currently served.
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := m.served.Load(); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("webhook serving certificate not loaded yet from Secret %s/%s", m.cfg.Namespace, m.cfg.SecretName)
}

// TLSOption sets GetCertificate on a server's tls.Config.
func (m *Manager) TLSOption(c *tls.Config) { c.GetCertificate = m.GetCertificate }

// Ready reports whether a serving certificate is loaded, for a readiness check.
func (m *Manager) Ready() error {
	_, err := m.GetCertificate(nil)
	return err
}

// Ensure makes the Secret hold a CA and serving certificate that are valid past the
// rotation margin and cover every host, writes the CA bundle into the webhook
// configurations, and serves the certificate. It returns when it next needs to run.
func (m *Manager) Ensure(ctx context.Context) (time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()

	secret, exists, err := m.readSecret(ctx)
	if err != nil {
		return time.Time{}, err
	}
	var old *bundle
	if exists {
		old = parse(&secret)
	}
	b, newCA, err := m.renew(old, now)
	if err != nil {
		return time.Time{}, err
	}

	// The API server must trust the new CA before anything serves a certificate it
	// signed: patch caBundle first, then give the informers a moment, then store.
	caBundle := append(append([]byte{}, b.caCert...), b.prevCA...)
	patchErr := errors.Join(m.patchCABundle(ctx, caBundle), m.writeCAConfigMaps(ctx, caBundle))
	if replacingCA := newCA && old != nil && old.ca != nil; replacingCA {
		if patchErr != nil {
			return time.Time{}, fmt.Errorf("not switching to a new CA until the webhook configurations trust it: %w", patchErr)
		}
		if err := sleep(ctx, min(5*time.Second, m.cfg.RotateBefore/4)); err != nil {
			return time.Time{}, err
		}
	}

	if err := m.store(ctx, &secret, exists, b); err != nil {
		return time.Time{}, err
	}
	if err := m.serve(b.cert, b.key); err != nil {
		return time.Time{}, err
	}
	next := b.leaf.NotAfter.Add(-m.cfg.RotateBefore)
	if ca := b.ca.NotAfter.Add(-m.cfg.RotateBefore); ca.Before(next) {
		next = ca
	}
	return next, patchErr
}

// Load serves what the Secret holds, for replicas that do not rotate. It holds the
// same lock as Ensure, so that it never puts back a certificate Ensure just replaced.
func (m *Manager) Load(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var secret corev1.Secret
	key := client.ObjectKey{Namespace: m.cfg.Namespace, Name: m.cfg.SecretName}
	if err := m.reader.Get(ctx, key, &secret); err != nil {
		return fmt.Errorf("reading webhook certificate Secret %s: %w", key, err)
	}
	return m.serve(secret.Data[KeyCert], secret.Data[KeyKey])
}

func (m *Manager) serve(certPEM, keyPEM []byte) error {
	if cur := m.served.Load(); cur != nil && len(cur.Certificate) > 0 {
		if blk, _ := pem.Decode(certPEM); blk != nil && bytes.Equal(blk.Bytes, cur.Certificate[0]) {
			return nil
		}
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("loading webhook serving certificate from Secret %s/%s: %w", m.cfg.Namespace, m.cfg.SecretName, err)
	}
	m.served.Store(&c)
	return nil
}
