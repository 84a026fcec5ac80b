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
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
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

// Ensure makes the Secret hold a CA and serving certificate that are valid past the
// rotation margin and cover every host, writes the CA bundle into the webhook
// configurations, and serves the certificate. It returns when it next needs to run.
func (m *Manager) Ensure(ctx context.Context) (time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()

	var secret corev1.Secret
	key := client.ObjectKey{Namespace: m.cfg.Namespace, Name: m.cfg.SecretName}
	exists := true
	if err := m.reader.Get(ctx, key, &secret); apierrors.IsNotFound(err) {
		exists = false
	} else if err != nil {
		return time.Time{}, fmt.Errorf("reading webhook certificate Secret %s: %w", key, err)
	}
	var old *bundle
	if exists {
		old = parse(&secret)
	}

	b := &bundle{}
	if old != nil {
		*b = *old
	}
	due := func(c *x509.Certificate) bool { return c == nil || !now.Add(m.cfg.RotateBefore).Before(c.NotAfter) }
	newCA := b.ca == nil || b.caSigner == nil || due(b.ca) || !samePublicKey(b.ca, b.caSigner)
	if newCA {
		b.prevCA = nil
		if old != nil && old.ca != nil && now.Before(old.ca.NotAfter) {
			// Until every replica serves a certificate from the new CA, the API server
			// must still trust the old one.
			b.prevCA = old.caCert
		}
		var err error
		if b.caCert, b.caKey, b.ca, b.caSigner, err = m.mintCA(now); err != nil {
			return time.Time{}, err
		}
	}
	if newCA || due(b.leaf) || !m.covers(b.leaf) || b.leaf.CheckSignatureFrom(b.ca) != nil || !keyMatches(b.cert, b.key) {
		var err error
		if b.cert, b.key, b.leaf, err = m.mintLeaf(now, b.ca, b.caSigner); err != nil {
			return time.Time{}, err
		}
		m.log.Info("minted webhook serving certificate", "serial", b.leaf.SerialNumber.String(), "notAfter", b.leaf.NotAfter, "newCA", newCA)
	}

	// The API server must trust the new CA before anything serves a certificate it
	// signed: patch caBundle first, then give the informers a moment, then store.
	caBundle := append(append([]byte{}, b.caCert...), b.prevCA...)
	patchErr := m.patchCABundle(ctx, caBundle)
	if patchErr != nil && newCA && old != nil && old.ca != nil {
		return time.Time{}, fmt.Errorf("not switching to a new CA until the webhook configurations trust it: %w", patchErr)
	}
	if newCA && old != nil && old.ca != nil {
		if err := sleep(ctx, min(5*time.Second, m.cfg.RotateBefore/4)); err != nil {
			return time.Time{}, err
		}
	}

	data := map[string][]byte{KeyCACert: b.caCert, KeyCAKey: b.caKey, KeyCert: b.cert, KeyKey: b.key}
	if len(b.prevCA) > 0 {
		data[KeyPreviousCACert] = b.prevCA
	}
	switch {
	case !exists:
		secret = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: m.cfg.Namespace, Name: m.cfg.SecretName,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "buildkite-operator", "app.kubernetes.io/component": "webhook"}},
			Type: corev1.SecretTypeOpaque,
			Data: data,
		}
		if err := m.client.Create(ctx, &secret); err != nil {
			return time.Time{}, fmt.Errorf("creating webhook certificate Secret %s: %w", key, err)
		}
	case !sameData(secret.Data, data):
		secret.Data = data
		// Update carries the resourceVersion read above: if another writer got there
		// first, this fails and the next pass starts from what it wrote.
		if err := m.client.Update(ctx, &secret); err != nil {
			return time.Time{}, fmt.Errorf("updating webhook certificate Secret %s: %w", key, err)
		}
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

func (m *Manager) covers(leaf *x509.Certificate) bool {
	if leaf == nil {
		return false
	}
	for _, h := range m.cfg.Hosts {
		if leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

func (m *Manager) mintCA(now time.Time) (certPEM, keyPEM []byte, cert *x509.Certificate, key *ecdsa.PrivateKey, err error) {
	key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("generating webhook CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: fmt.Sprintf("buildkite-operator-webhook-ca@%d", now.Unix())},
		NotBefore:             now.Add(-time.Minute), // tolerate a little clock skew
		NotAfter:              now.Add(m.cfg.CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("signing webhook CA: %w", err)
	}
	cert, _ = x509.ParseCertificate(der)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("encoding webhook CA key: %w", err)
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), cert, key, nil
}

func (m *Manager) mintLeaf(now time.Time, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (certPEM, keyPEM []byte, cert *x509.Certificate, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generating webhook serving key: %w", err)
	}
	notAfter := now.Add(m.cfg.CertValidity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: m.cfg.Hosts[0]},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range m.cfg.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("signing webhook serving certificate: %w", err)
	}
	cert, _ = x509.ParseCertificate(der)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encoding webhook serving key: %w", err)
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), cert, nil
}

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

// Runnables returns the rotator (leader only) and the loader (every replica), to add to
// a controller-runtime manager.
func (m *Manager) Runnables() []manager.Runnable {
	return []manager.Runnable{&rotator{m}, &loader{m}}
}

type rotator struct{ m *Manager }

func (r *rotator) NeedLeaderElection() bool { return true }

func (r *rotator) Start(ctx context.Context) error {
	m := r.m
	for {
		next, err := m.Ensure(ctx)
		wait := m.cfg.SyncInterval
		if err != nil {
			m.log.Error(err, "keeping webhook certificates current")
			wait = min(wait, 5*time.Second)
		}
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(m.cfg.Now()), 100*time.Millisecond))
		}
		if err := sleep(ctx, wait); err != nil {
			return nil
		}
	}
}

type loader struct{ m *Manager }

func (l *loader) NeedLeaderElection() bool { return false }

func (l *loader) Start(ctx context.Context) error {
	m := l.m
	// Poll more often than the rotation margin, so that a replica serves a renewed
	// certificate well before the old one expires.
	interval := min(m.cfg.SyncInterval, m.cfg.RotateBefore/4)
	for {
		wait := interval
		if err := m.Load(ctx); err != nil {
			if m.served.Load() != nil || !apierrors.IsNotFound(err) {
				m.log.Error(err, "loading webhook serving certificate")
			}
			wait = min(wait, time.Second)
		}
		if err := sleep(ctx, wait); err != nil {
			return nil
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return n.Add(n, big.NewInt(1))
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func samePublicKey(c *x509.Certificate, k *ecdsa.PrivateKey) bool {
	pub, ok := c.PublicKey.(*ecdsa.PublicKey)
	return ok && pub.Equal(&k.PublicKey)
}

func keyMatches(certPEM, keyPEM []byte) bool {
	_, err := tls.X509KeyPair(certPEM, keyPEM)
	return err == nil
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
