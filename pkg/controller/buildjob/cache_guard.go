package buildjob

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// A trimmed BuildJob (trimBuildJob) must never be written back over the real one: an
// Update from it would ask to clear the parts of the spec the cache dropped. Two things
// stop that, either one enough:
//
//   - the API server: the spec is immutable (the CRD's `self == oldSelf` rule on spec),
//     and a trimmed copy's spec always differs from the stored one (trimBuildJob marks a
//     copy only when it dropped something), so an Update of it is refused as Invalid
//     whatever client sends it, and its mark never reaches storage. A status Update takes
//     only the status from the request, which is kept whole. This holds for every code
//     path, today's and tomorrow's, and with or without the operator's webhooks.
//   - the process: GuardTrimmed refuses, before any request, to write a BuildJob that
//     carries the mark, with an error that says what happened, so a code path that
//     would try fails on its first try with words that point here rather than with
//     the API server's "spec is immutable".
//
// Nothing in the process tries today: the controller writes a BuildJob (its finalizer,
// its status) only before it is trimmable, and the spawner never updates one.

// AnnotationCacheTrimmed marks, in the manager's cache only, a BuildJob copy without the
// parts of its spec that nothing reads once the job is reported (ConfigureCache). It is
// never stored: its value is drawn by each process (trimMark), so a value someone wrote
// into a stored BuildJob does not make the process take that BuildJob for a trimmed copy.
const AnnotationCacheTrimmed = "buildkite-operator.dev/cache-trimmed"

// trimMark is this process's value of AnnotationCacheTrimmed.
var trimMark = func() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return "trimmed-by-cache-" + hex.EncodeToString(b)
}()

// TrimmedInCache reports whether job is, or was copied from, the cache's trimmed copy of
// a reported BuildJob: its spec lacks what only running the job needed.
func TrimmedInCache(job *bkv1.BuildJob) bool {
	return job.Annotations[AnnotationCacheTrimmed] == trimMark
}

// ErrTrimmedCopy is the error, wrapped, of a write GuardTrimmed refuses.
var ErrTrimmedCopy = errors.New("it is the manager cache's trimmed copy of a reported BuildJob, " +
	"which lacks the parts of the spec nothing reads once the job is reported (see ConfigureCache); " +
	"read the BuildJob from the API server (the manager's APIReader) and write that copy instead")

// GuardTrimmed is c refusing to create, update (whole or a subresource) or patch with a
// whole object (server-side apply) a BuildJob that is a trimmed copy (TrimmedInCache),
// and any patch that would store the trimmed mark. Diff patches made from a trimmed copy
// (client.MergeFrom) send only what the caller changed, and go through.
func GuardTrimmed(c client.Client) client.Client { return trimGuard{Client: c} }

type trimGuard struct{ client.Client }

func (g trimGuard) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := refuseTrimmed("create", obj, nil); err != nil {
		return err
	}
	return g.Client.Create(ctx, obj, opts...)
}

func (g trimGuard) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := refuseTrimmed("update", obj, nil); err != nil {
		return err
	}
	return g.Client.Update(ctx, obj, opts...)
}

func (g trimGuard) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := refuseTrimmed("patch", obj, patch); err != nil {
		return err
	}
	return g.Client.Patch(ctx, obj, patch, opts...)
}

func (g trimGuard) Status() client.SubResourceWriter {
	return subResourceGuard{SubResourceClient: g.Client.SubResource("status"), w: g.Client.Status(), name: "status"}
}

func (g trimGuard) SubResource(name string) client.SubResourceClient {
	sub := g.Client.SubResource(name)
	return subResourceGuard{SubResourceClient: sub, w: sub, name: name}
}

// subResourceGuard guards the writes of one subresource; w is the writer the wrapped
// client gives for it (Status() or SubResource(name)).
type subResourceGuard struct {
	client.SubResourceClient
	w    client.SubResourceWriter
	name string
}

func (g subResourceGuard) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	if err := refuseTrimmed("create "+g.name+" of", obj, nil); err != nil {
		return err
	}
	return g.w.Create(ctx, obj, sub, opts...)
}

func (g subResourceGuard) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := refuseTrimmed("update "+g.name+" of", obj, nil); err != nil {
		return err
	}
	return g.w.Update(ctx, obj, opts...)
}

func (g subResourceGuard) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := refuseTrimmed("patch "+g.name+" of", obj, patch); err != nil {
		return err
	}
	return g.w.Patch(ctx, obj, patch, opts...)
}

// refuseTrimmed is the error of writing obj (with patch, nil for a whole-object write) when
// obj is a trimmed BuildJob copy, or the patch would store the trimmed mark; nil otherwise.
func refuseTrimmed(verb string, obj client.Object, patch client.Patch) error {
	job, ok := obj.(*bkv1.BuildJob)
	if !ok {
		return nil
	}
	refused := TrimmedInCache(job) && (patch == nil || patch.Type() == types.ApplyPatchType)
	if !refused && patch != nil {
		data, err := patch.Data(obj)
		if err != nil {
			return fmt.Errorf("cannot %s BuildJob %s/%s: computing the patch: %w", verb, job.Namespace, job.Name, err)
		}
		refused = bytes.Contains(data, []byte(AnnotationCacheTrimmed))
	}
	if refused {
		return fmt.Errorf("refusing to %s BuildJob %s/%s: %w", verb, job.Namespace, job.Name, ErrTrimmedCopy)
	}
	return nil
}
