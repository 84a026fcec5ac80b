package webhook

import (
	"context"
	"fmt"
	"sync"

	authenticationv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// operatorIdentity is who the operator is to the API server, learnt once with a
// SelfSubjectReview (which every authenticated user may make), so that the webhooks tell
// the operator's own writes from everyone else's without being told its service account.
type operatorIdentity struct {
	c client.Client

	mu   sync.Mutex
	name string
}

// is reports whether user is the operator.
func (o *operatorIdentity) is(ctx context.Context, user authenticationv1.UserInfo) (bool, error) {
	name, err := o.username(ctx)
	if err != nil {
		return false, err
	}
	return user.Username == name, nil
}

func (o *operatorIdentity) username(ctx context.Context) (string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.name != "" {
		return o.name, nil
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := o.c.Create(ctx, review); err != nil {
		return "", fmt.Errorf("asking the API server who the operator is (SelfSubjectReview): %w", err)
	}
	if review.Status.UserInfo.Username == "" {
		return "", fmt.Errorf("the API server's SelfSubjectReview named no user for the operator")
	}
	o.name = review.Status.UserInfo.Username
	return o.name, nil
}
