// Package seal marks what only the operator makes, so that the operator can tell its own
// objects from look-alikes that anyone with rights in a job namespace could write.
//
// A seal is an HMAC-SHA256 over the facts that bind an object to the operator (for a
// BuildJob: its namespace, name, UID and Buildkite job id), under a key kept in a Secret
// of the operator's namespace, which job namespaces' users cannot read. Sealing needs no
// webhook: the spawner seals what it makes and the controller checks the seal before it
// hands out anything of a job, so the rule holds on clusters that run without webhooks.
package seal

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The key's Secret in the operator's namespace. The spawner, the controller and the
// webhooks of every replica read it; the first to need it makes it.
// +kubebuilder:rbac:groups="",namespace=buildkite,resources=secrets,verbs=get;create
const (
	SecretName = "buildkite-operator-seal"
	secretKey  = "key"
	keyBytes   = 32
)

// Key signs and checks seals.
type Key struct{ k []byte }

// NewKey is a Key of the given bytes (tests, and Source).
func NewKey(k []byte) *Key { return &Key{k: append([]byte(nil), k...)} }

// Sign is the seal of parts, in order. Each part is length-prefixed, so that no two lists
// of parts share a seal ("ab","c" and "a","bc" differ).
func (k *Key) Sign(parts ...string) string {
	m := hmac.New(sha256.New, k.k)
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		m.Write(n[:])
		m.Write([]byte(p))
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Verify reports whether mac is the seal of parts, in constant time.
func (k *Key) Verify(mac string, parts ...string) bool {
	if k == nil || mac == "" {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(k.Sign(parts...)))
}

// Source loads the key from its Secret once, making the Secret when it does not exist,
// and keeps it. A failed load is tried again at the next call. Safe for concurrent use.
type Source struct {
	// Client writes the Secret; Reader reads it past any cache (the operator's cache
	// does not hold it).
	Client    client.Client
	Reader    client.Reader
	Namespace string

	mu  sync.Mutex
	key *Key
}

// Fixed is a Source that always gives k (tests).
func Fixed(k *Key) *Source { return &Source{key: k} }

// Key is the operator's seal key.
func (s *Source) Key(ctx context.Context) (*Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key != nil {
		return s.key, nil
	}
	if s.Reader == nil || s.Client == nil {
		return nil, errors.New("no seal key: the seal Source has no client")
	}
	nn := client.ObjectKey{Namespace: s.Namespace, Name: SecretName}
	var sec corev1.Secret
	err := s.Reader.Get(ctx, nn, &sec)
	if apierrors.IsNotFound(err) {
		k := make([]byte, keyBytes)
		if _, err := rand.Read(k); err != nil {
			return nil, fmt.Errorf("making a seal key: %w", err)
		}
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: SecretName, Namespace: s.Namespace},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{secretKey: k},
		}
		err = s.Client.Create(ctx, &sec)
		if apierrors.IsAlreadyExists(err) {
			// Another replica made it first: use theirs.
			err = s.Reader.Get(ctx, nn, &sec)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("loading the seal key from Secret %s/%s: %w", s.Namespace, SecretName, err)
	}
	if len(sec.Data[secretKey]) < keyBytes {
		return nil, fmt.Errorf("the seal key in Secret %s/%s is missing or shorter than %d bytes: delete the Secret and restart the operator (jobs in flight then fail their seal check)",
			s.Namespace, SecretName, keyBytes)
	}
	s.key = NewKey(sec.Data[secretKey])
	return s.key, nil
}
