package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// Sample is one look at agentd's memory and the run's progress in the measured window.
type Sample struct {
	// Seconds is the time since the window's start.
	Seconds float64 `json:"seconds"`
	// Queued and Finished count the jobs queued and ended on the fake so far.
	Queued   int `json:"queued"`
	Finished int `json:"finished"`
	// BuildJobs and Pods are the BuildJobs and job pods that exist, as the watch sees them:
	// the BuildJobs the operator keeps after their jobs (its retention) are among them.
	BuildJobs int `json:"buildjobs"`
	Pods      int `json:"pods"`
	// Secrets are the Secrets in the namespace: the job token Secrets, which go with their
	// BuildJobs (the garbage collector deletes them), and the operator's own few.
	Secrets int `json:"secrets"`
	// RSSMiB is agentd's VmRSS; HeapInuseMiB its Go heap in use (its metrics).
	RSSMiB       float64 `json:"rss_mib"`
	HeapInuseMiB float64 `json:"heap_inuse_mib"`
}

// sampler samples every SampleEvery until stopped.
type sampler struct {
	stopping chan struct{}
	done     chan struct{}
	samples  []Sample
}

// startSampling samples now, then every SampleEvery, and once more when stopped.
func (r *run) startSampling(ctx context.Context, from time.Time, q *queued) *sampler {
	s := &sampler{stopping: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(r.cfg.SampleEvery)
		defer t.Stop()
		for {
			s.samples = append(s.samples, r.sample(ctx, from, q))
			select {
			case <-s.stopping:
				s.samples = append(s.samples, r.sample(ctx, from, q))
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop takes the last sample and returns them all.
func (s *sampler) stop() []Sample {
	close(s.stopping)
	<-s.done
	return s.samples
}

// sample looks at the run now. What cannot be read is left 0: a sample is not worth
// failing the run for.
func (r *run) sample(ctx context.Context, from time.Time, q *queued) Sample {
	s := Sample{Seconds: time.Since(from).Seconds()}
	ids := q.all()
	s.Queued = len(ids)
	for _, id := range ids {
		if j, ok := r.fake.Job(id); ok && fakebuildkite.IsTerminal(j.State) {
			s.Finished++
		}
	}
	s.BuildJobs, s.Pods = r.w.counts()
	s.Secrets = r.countSecrets(ctx)
	if rss, err := r.op.rss(); err == nil {
		s.RSSMiB = float64(rss) / (1 << 20)
	}
	if m, err := scrape(ctx, r.metricsAddr); err == nil {
		s.HeapInuseMiB = m.sum("go_memstats_heap_inuse_bytes", "") / (1 << 20)
	}
	return s
}

// countSecrets is how many Secrets the namespace has, from a list of one item's metadata
// and the count the API server gives of the rest (no selector: it gives none with one);
// 0 when it cannot tell.
func (r *run) countSecrets(ctx context.Context) int {
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	if err := r.c.List(ctx, &list, client.InNamespace(namespace), client.Limit(1)); err != nil {
		return 0
	}
	n := len(list.Items)
	if rest := list.GetRemainingItemCount(); rest != nil {
		n += int(*rest)
	}
	return n
}

// maxSampleRows is how many samples PrintSamples shows at most.
const maxSampleRows = 25

// PrintSamples writes r's samples as a Markdown table: at most maxSampleRows of them,
// evenly spread, the last always included.
func PrintSamples(w io.Writer, r *Result) {
	fmt.Fprintln(w, "| seconds | jobs queued | jobs finished | BuildJobs | job pods | Secrets | agentd RSS | agentd heap in use |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, s := range spread(r.Samples, maxSampleRows) {
		fmt.Fprintf(w, "| %.0f | %d | %d | %d | %d | %d | %.1f MiB | %.1f MiB |\n",
			s.Seconds, s.Queued, s.Finished, s.BuildJobs, s.Pods, s.Secrets, s.RSSMiB, s.HeapInuseMiB)
	}
}

// spread is at most n of ss, evenly spaced, the first and the last included.
func spread[T any](ss []T, n int) []T {
	if len(ss) <= n || n < 2 {
		return ss
	}
	out := make([]T, 0, n)
	for i := range n {
		out = append(out, ss[i*(len(ss)-1)/(n-1)])
	}
	return out
}
