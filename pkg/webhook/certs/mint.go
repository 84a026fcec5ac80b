package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// renew returns what the Secret should hold: old's CA and serving certificate (old is nil
// when there is no Secret) where they are still good, new ones where they are due, broken
// or do not match; newCA says the CA is new.
func (m *Manager) renew(old *bundle, now time.Time) (b *bundle, newCA bool, err error) {
	b = &bundle{}
	if old != nil {
		*b = *old
	}
	due := func(c *x509.Certificate) bool { return c == nil || !now.Add(m.cfg.RotateBefore).Before(c.NotAfter) }
	newCA = b.ca == nil || b.caSigner == nil || due(b.ca) || !samePublicKey(b.ca, b.caSigner)
	if newCA {
		b.prevCA = nil
		if old != nil && old.ca != nil && now.Before(old.ca.NotAfter) {
			// Until every replica serves a certificate from the new CA, the API server
			// must still trust the old one.
			b.prevCA = old.caCert
		}
		if b.caCert, b.caKey, b.ca, b.caSigner, err = m.mintCA(now); err != nil {
			return nil, false, err
		}
	}
	if newCA || due(b.leaf) || !m.covers(b.leaf) || b.leaf.CheckSignatureFrom(b.ca) != nil || !keyMatches(b.cert, b.key) {
		if b.cert, b.key, b.leaf, err = m.mintLeaf(now, b.ca, b.caSigner); err != nil {
			return nil, false, err
		}
		m.log.Info("minted webhook serving certificate", "serial", b.leaf.SerialNumber.String(), "notAfter", b.leaf.NotAfter, "newCA", newCA)
	}
	return b, newCA, nil
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
