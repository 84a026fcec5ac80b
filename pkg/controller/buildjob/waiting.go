package buildjob

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

// What keeps a job's command from starting is shown to the pipeline's authors on the
// Buildkite job itself, as a job-scoped annotation written with the job's token: they
// rarely have kubectl, and the job's log only starts with the command. The annotation is
// written when what the job waits for changes (the WaitShown condition remembers what it
// says, so a reconcile that finds the same wait writes nothing), and removed when the
// command starts or the job ends.

// waitNotice is what keeps the job's command from starting, in the pipeline authors' words.
type waitNotice struct {
	// reason is the WaitShown condition's reason: one of the wait reasons.
	reason string
	// style is the annotation's: info for a wait that is going as it should (an image
	// being pulled), warning for one that will fail the job if it lasts.
	style string
	text  string
}

// key identifies what n says, for jobMemory.shown.
func (n *waitNotice) key() string { return n.reason + "\x00" + n.text }

// waitContext is the annotation's context. The job's ID makes it the job's own even on a
// Buildkite that shows every annotation on the build.
func waitContext(job *bkv1.BuildJob) string {
	return "buildkite-operator-waiting-" + job.Spec.JobID
}

// maxWaitText bounds the annotation's text: Kubernetes' messages can be long, and the
// condition that keeps the text has a limit too.
const maxWaitText = 2000

// showWait makes the Buildkite job show n, unless it shows it already; nil n removes what
// it shows. A failed call is logged and tried again on a later reconcile: the notice is
// for people, and the job goes on without it.
func (r *Reconciler) showWait(ctx context.Context, s *scope, n *waitNotice) error {
	job := s.job
	if n == nil {
		return r.clearWait(ctx, s, "The job's pod no longer waits for anything unusual.")
	}
	if len(n.text) > maxWaitText {
		n.text = n.text[:maxWaitText-len(" …")] + " …"
	}
	if c := condition(job, bkv1.ConditionWaitShown); c != nil && c.Status == metav1.ConditionTrue && c.Reason == n.reason && c.Message == n.text {
		return nil
	}
	// The cache can hand a reconcile a BuildJob older than the status the last one wrote:
	// what this process posted last is remembered too, so that only the status is written.
	if s.memory().shown != n.key() {
		bk, err := s.buildkite(ctx)
		if err != nil {
			return ignoreNoToken(err)
		}
		bctx, cancel := s.buildkiteContext(ctx)
		defer cancel()
		err = bk.Annotate(bctx, job.Spec.JobID, agentapi.Annotation{
			Context: waitContext(job), Style: n.style, Body: n.text, Scope: agentapi.ScopeJob,
		})
		if err != nil {
			buildkiteErrors.WithLabelValues(string(agentapi.CallAnnotate)).Inc()
			log.FromContext(ctx).Info("showing what the job waits for on Buildkite failed; trying again later", "reason", n.reason, "error", err.Error())
			return nil
		}
		s.remember(func(m *jobMemory) { m.shown = n.key() })
	}
	return r.updateStatus(ctx, job, func(*bkv1.BuildJobStatus) {
		setCondition(job, bkv1.ConditionWaitShown, metav1.ConditionTrue, n.reason, n.text)
	})
}

// clearWait removes the annotation showWait wrote, if any; why goes into the WaitShown
// condition. Buildkite no longer having it (404), or no longer taking calls for the job
// (it ended), counts as removed; any other failure is logged and tried again on a later
// reconcile.
func (r *Reconciler) clearWait(ctx context.Context, s *scope, why string) error {
	job := s.job
	if !conditionIs(job, bkv1.ConditionWaitShown, metav1.ConditionTrue) {
		return nil
	}
	bk, err := s.buildkite(ctx)
	if err != nil {
		return ignoreNoToken(err)
	}
	bctx, cancel := s.buildkiteContext(ctx)
	defer cancel()
	err = bk.RemoveAnnotation(bctx, job.Spec.JobID, waitContext(job), agentapi.ScopeJob)
	if err != nil && !agentapi.IsPermanent(err) {
		buildkiteErrors.WithLabelValues(string(agentapi.CallAnnotate)).Inc()
		log.FromContext(ctx).Info("removing the notice of what the job waited for from Buildkite failed; trying again later", "error", err.Error())
		return nil
	}
	s.remember(func(m *jobMemory) { m.shown = "" })
	return r.updateStatus(ctx, job, func(*bkv1.BuildJobStatus) {
		setCondition(job, bkv1.ConditionWaitShown, metav1.ConditionFalse, bkv1.ReasonWaitOver, why)
	})
}

// podWaitNotice says, of what job's pod waits for (waits, from podstate.Waiting), what
// keeps its command from starting, or nil when it is nothing an author needs to know of
// (the pod is being scheduled, or its containers created, as they should be). The first
// wait that needs saying is said, in the order podstate finds them; the images being
// pulled are said together.
func (r *Reconciler) podWaitNotice(s *scope, waits podstate.Waits) *waitNotice {
	envName := s.envName()
	var pulls []string
	for _, w := range waits {
		switch w.Kind {
		case podstate.WaitNode:
			return r.nodeWaitNotice(s, &w, envName)
		case podstate.WaitImagePull:
			return r.imagePullNotice(&w, envName)
		case podstate.WaitCreateContainer:
			return &waitNotice{reason: bkv1.ReasonContainerCreateFailing, style: "warning", text: fmt.Sprintf(
				"Container %q cannot be created: %s%s. Check the Secrets, ConfigMaps and volumes BuildEnvironment %q refers to; the job fails if this lasts %s.",
				w.Container, w.Reason, detailOf(w.Message), envName, humanDuration(r.opts.ImagePullGrace))}
		case podstate.WaitCrashLoop:
			if w.Init {
				return crashLoopNotice(&w, envName)
			}
		case podstate.WaitPodSetup:
			if w.Reason != "" {
				// The first failure, which stays first as the kubelet repeats it: the
				// text changes only when what fails does.
				return &waitNotice{reason: bkv1.ReasonPodSetupFailing, style: "warning", text: fmt.Sprintf(
					"The job's pod cannot get ready to start its containers: %s: %s. Check the volumes, Secrets and ConfigMaps BuildEnvironment %q mounts; the job fails if this lasts %s.",
					w.Reason, strings.TrimSuffix(w.Message, "."), envName, humanDuration(r.opts.PodSetupTimeout))}
			}
		case podstate.WaitPulling:
			pulls = append(pulls, pullingText(&w))
		}
	}
	if len(pulls) > 0 {
		return &waitNotice{reason: bkv1.ReasonPullingImage, style: "info", text: strings.Join(pulls, "; ") + "."}
	}
	return nil
}

// nodeWaitNotice says that no node can take the job's pod (w), and until when the job
// waits for one.
func (r *Reconciler) nodeWaitNotice(s *scope, w *podstate.Wait, envName string) *waitNotice {
	job, pod := s.job, s.pod
	text := "Waiting for a node"
	if w.Message != "" {
		text += ": " + w.Message
	}
	asks := ""
	if req := describeRequests(pod); req != "" {
		asks = " asks for " + req
	}
	bound, byJob := schedulingBound(job, r.opts.UnschedulableTimeout)
	within := humanDuration(bound)
	if byJob {
		within += ", its own timeout"
	}
	text += fmt.Sprintf(" (BuildEnvironment %q%s.) The job fails if no node can take it within %s.", envName, asks, within)
	return &waitNotice{reason: bkv1.ReasonWaitingForNode, style: "warning", text: text}
}

// imagePullNotice says that a container's image cannot be pulled (w), with the error of
// its last pull: the container's status and the kubelet's event give the same text.
func (r *Reconciler) imagePullNotice(w *podstate.Wait, envName string) *waitNotice {
	pullErr := w.PullError
	if pullErr == "" {
		pullErr = "the last try failed; the cluster keeps trying"
	}
	return &waitNotice{reason: bkv1.ReasonImagePullFailing, style: "warning", text: fmt.Sprintf(
		"Image %s cannot be pulled: %s%s. Check the image's name and tag, and that the cluster can reach its registry (a private registry needs imagePullSecrets in BuildEnvironment %q); the job fails if this lasts %s.",
		w.Image, podstate.ReasonErrImagePull, detailOf(pullErr), envName, humanDuration(r.opts.ImagePullGrace))}
}

// crashLoopNotice says that an init container (a sidecar) keeps failing (w), which keeps
// the job's command from starting.
func crashLoopNotice(w *podstate.Wait, envName string) *waitNotice {
	exit := ""
	if t := w.LastExit; t != nil {
		exit = fmt.Sprintf(" (exit code %d%s)", t.ExitCode, describeTermination(t))
	}
	return &waitNotice{reason: bkv1.ReasonInitContainerFailing, style: "warning", text: fmt.Sprintf(
		"Container %q keeps failing%s, and the job's command starts only once it runs. Check its image and command in BuildEnvironment %q.",
		w.Container, exit, envName)}
}

// pullingText says that the image of a container is being pulled (w), since when.
func pullingText(w *podstate.Wait) string {
	what := "Pulling image " + w.Image
	if w.Container == podcontract.InstallContainer {
		what = "Pulling the operator's image " + w.Image
	}
	return fmt.Sprintf("%s (started %s UTC)", what, w.Since.UTC().Format(time.TimeOnly))
}

// quotaWaitNotice is what a job whose pod a ResourceQuota refuses waits for; err is the
// refusal.
func (r *Reconciler) quotaWaitNotice(err error) *waitNotice {
	msg := err.Error()
	if i := strings.Index(msg, "exceeded quota"); i >= 0 {
		// Leave out `pods "<name>" is forbidden: `, which is about Kubernetes objects.
		msg = msg[i:]
	}
	return &waitNotice{reason: bkv1.ReasonWaitingForQuota, style: "warning", text: fmt.Sprintf(
		"Waiting for quota: Kubernetes refuses the job's pod for now (%s). The pod is created once other jobs free their share; the job fails if this lasts %s.",
		strings.TrimSuffix(msg, "."), humanDuration(r.opts.QuotaTimeout))}
}

func detailOf(message string) string {
	if message == "" {
		return ""
	}
	return ": " + strings.TrimSuffix(message, ".")
}

// describeRequests says what the pod's containers ask for together, such as
// "cpu 64, memory 1Gi", as the scheduler counts them: the containers and sidecars.
func describeRequests(pod *corev1.Pod) string {
	total := corev1.ResourceList{}
	add := func(c corev1.Container) {
		for name, q := range c.Resources.Requests {
			sum := total[name]
			sum.Add(q)
			total[name] = sum
		}
	}
	for _, c := range pod.Spec.Containers {
		add(c)
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	names := make([]string, 0, len(total))
	for name := range total {
		names = append(names, string(name))
	}
	slices.Sort(names)
	parts := make([]string, 0, len(names))
	for _, name := range names {
		q := total[corev1.ResourceName(name)]
		parts = append(parts, name+" "+q.String())
	}
	return strings.Join(parts, ", ")
}

// humanDuration writes d as people do: "5 minutes", "30 seconds", "1.5s".
func humanDuration(d time.Duration) string {
	plural := func(n int64, unit string) string {
		if n == 1 {
			return "1 " + unit
		}
		return fmt.Sprintf("%d %ss", n, unit)
	}
	switch {
	case d >= time.Minute && d%time.Minute == 0:
		return plural(int64(d/time.Minute), "minute")
	case d >= time.Second && d%time.Second == 0:
		return plural(int64(d/time.Second), "second")
	}
	return d.String()
}
