package spawner

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// retryable marks an error worth retrying that isPermanent would call permanent.
type retryable struct{ error }

func (r retryable) Unwrap() error { return r.error }

// isPermanent reports an API server answer that retrying will not change: a refusal
// (invalid, forbidden, a webhook's denial). Anything else (timeouts, 5xx, 429, failures
// to reach it) is worth retrying.
func isPermanent(err error) bool {
	var r retryable
	if errors.As(err, &r) {
		return false
	}
	var f errForeignSecret
	if errors.As(err, &f) {
		return true
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	switch {
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsTooManyRequests(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err):
		return false
	}
	return st.Status().Code >= 400 && st.Status().Code < 500
}

// retryKube calls f until it succeeds, fails permanently or ctx ends; then it returns
// the last error.
func retryKube(ctx context.Context, f func() error) error {
	wait := 200 * time.Millisecond
	for {
		err := f()
		if err == nil || isPermanent(err) {
			return err
		}
		if !sleep(ctx, wait) {
			return err
		}
		wait = min(wait*2, 10*time.Second)
	}
}
