package certs

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Runnables returns the rotator (leader only) and the loader (every replica), to add to
// a controller-runtime manager.
func (m *Manager) Runnables() []manager.Runnable {
	return []manager.Runnable{&rotator{m}, &loader{m}}
}

// rotator is the leader's loop: Ensure, then again at the next renewal or sync interval.
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

// loader is every replica's loop: serve what the Secret holds, as it changes.
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
