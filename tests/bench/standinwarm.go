package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// retryQuiet is how long after a failed attempt a warm pod's client is surely asking again:
// it waits at most handoffclient.DefaultMaxBackoff between attempts.
const retryQuiet = handoffclient.DefaultMaxBackoff + time.Second

// configMapWait bounds the wait for a warm pod's CA ConfigMap, which agentd's certificate
// manager writes: the kubelet would not start the pod's container without it.
const configMapWait = time.Minute

// runWarm is a warm pod's supervisor, as `agentd supervise` is with BK_OPERATOR_HANDOFF_URL
// set: it waits at agentd's hand-off endpoint for the pod's job, then runs it as a job
// pod's supervisor does. ctx ends when the pod goes before a job came for it, which is no
// error: the supervisor exits 0 then too.
func (s *standIn) runWarm(ctx context.Context, pod *corev1.Pod) error {
	files, err := s.project(ctx, pod)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	s.setWarm(pod.UID, func(w *warmPod) { w.asking = time.Now() })
	c := &handoffclient.Client{URL: files.url, TokenPath: files.token, CAPath: files.ca, Logf: func(format string, args ...any) {
		s.setWarm(pod.UID, func(w *warmPod) { w.failed, w.lastFailed = time.Now(), fmt.Sprintf(format, args...) })
	}}
	job, err := c.Fetch(ctx)
	if err != nil {
		s.setWarm(pod.UID, func(w *warmPod) { w.gaveUp = true })
		if ctx.Err() != nil || s.going(pod) {
			// Deleted while it waited: agentd forgets a pod it deletes, and may refuse it
			// before the watch shows the deletion. The pod's supervisor ends with it.
			return nil
		}
		return fmt.Errorf("warm pod: %w", err)
	}
	at := time.Now()
	s.mu.Lock()
	if w := s.warm[pod.UID]; w != nil {
		w.handedOff = at
	}
	s.handoffs[job.ID] = handoffSeen{pod: pod.Name, at: at}
	s.mu.Unlock()
	// This copy of the pod predates its assignment: the pod is read again to end it.
	return s.runJob(pod, warmEnv(pod, job), false)
}

// going tells whether pod is deleted or being deleted, as the API server has it now.
func (s *standIn) going(pod *corev1.Pod) bool {
	cur := &corev1.Pod{}
	err := s.c.Get(s.ctx, client.ObjectKeyFromObject(pod), cur)
	return apierrors.IsNotFound(err) || (err == nil && (cur.UID != pod.UID || !cur.DeletionTimestamp.IsZero()))
}

// warmEnv is the env a warm pod's supervisor runs job with: the job container's own,
// without the hand-off's settings, the job's over it, and its token where a job pod has it.
func warmEnv(pod *corev1.Pod, job handoffclient.Job) map[string]string {
	env := literalEnv(pod)
	for _, k := range []string{podcontract.EnvHandoffURL, podcontract.EnvHandoffTokenPath, podcontract.EnvHandoffCAPath} {
		delete(env, k)
	}
	for k, v := range job.Env {
		env[k] = v
	}
	if env[podcontract.EnvJobID] == "" {
		env[podcontract.EnvJobID] = job.ID
	}
	env[podcontract.EnvAccessToken] = job.Token
	return env
}

// literalEnv is the job container's env given by value.
func literalEnv(pod *corev1.Pod) map[string]string {
	env := map[string]string{}
	for _, c := range pod.Spec.Containers {
		if c.Name != podcontract.JobContainer {
			continue
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				env[e.Name] = e.Value
			}
		}
	}
	return env
}

func (s *standIn) setWarm(uid types.UID, f func(*warmPod)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.warm[uid]; w != nil {
		f(w)
	}
}

// handoffFiles are a warm pod's hand-off settings, its files on this host.
type handoffFiles struct {
	url, token, ca string
}

// project writes the files of pod's hand-off volume as the kubelet would, the token minted
// for the pod and the CA bundle from its ConfigMap, and returns where they are.
func (s *standIn) project(ctx context.Context, pod *corev1.Pod) (handoffFiles, error) {
	env := literalEnv(pod)
	files := handoffFiles{url: env[podcontract.EnvHandoffURL]}
	if files.url == "" || env[podcontract.EnvHandoffTokenPath] == "" {
		return files, fmt.Errorf("warm pod: its job container has no %s or %s", podcontract.EnvHandoffURL, podcontract.EnvHandoffTokenPath)
	}
	dir := filepath.Join(s.dir, "warm-pods", string(pod.UID))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return files, err
	}
	for _, f := range []struct {
		inPod string
		out   *string
	}{{env[podcontract.EnvHandoffTokenPath], &files.token}, {env[podcontract.EnvHandoffCAPath], &files.ca}} {
		if f.inPod == "" {
			continue
		}
		src, key, err := projectionOf(pod, f.inPod)
		if err != nil {
			return files, err
		}
		data, err := s.projectedData(ctx, pod, src, key)
		if err != nil {
			return files, fmt.Errorf("warm pod: %s: %w", f.inPod, err)
		}
		*f.out = filepath.Join(dir, path.Base(f.inPod))
		if err := os.WriteFile(*f.out, data, 0o600); err != nil {
			return files, err
		}
	}
	return files, nil
}

// projectionOf finds the projected volume source of the file at p in pod's job container,
// and for a ConfigMap the key it holds.
func projectionOf(pod *corev1.Pod, p string) (corev1.VolumeProjection, string, error) {
	for _, c := range pod.Spec.Containers {
		if c.Name != podcontract.JobContainer {
			continue
		}
		for _, m := range c.VolumeMounts {
			rel, ok := strings.CutPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/")
			if !ok {
				continue
			}
			for _, v := range pod.Spec.Volumes {
				if v.Name != m.Name || v.Projected == nil {
					continue
				}
				for _, src := range v.Projected.Sources {
					if t := src.ServiceAccountToken; t != nil && t.Path == rel {
						return src, "", nil
					}
					if cm := src.ConfigMap; cm != nil {
						for _, it := range cm.Items {
							if it.Path == rel {
								return src, it.Key, nil
							}
						}
					}
				}
			}
		}
	}
	return corev1.VolumeProjection{}, "", fmt.Errorf("warm pod: no projected volume of its job container holds %s", p)
}

// projectedData is what the kubelet writes for src: a token of the pod's ServiceAccount
// bound to the pod, or key of a ConfigMap of the pod's namespace.
func (s *standIn) projectedData(ctx context.Context, pod *corev1.Pod, src corev1.VolumeProjection, key string) ([]byte, error) {
	if t := src.ServiceAccountToken; t != nil {
		return s.mintToken(ctx, pod, t)
	}
	if src.ConfigMap == nil {
		return nil, errors.New("the stand-in projects only ServiceAccount tokens and ConfigMaps")
	}
	name := src.ConfigMap.Name
	deadline := time.Now().Add(configMapWait)
	for {
		var cm corev1.ConfigMap
		err := s.c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, &cm)
		switch {
		case err == nil && cm.Data[key] != "":
			return []byte(cm.Data[key]), nil
		case err != nil && !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("reading ConfigMap %s: %w", name, err)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("ConfigMap %s has no %s after %s: agentd's certificate manager writes it (--manage-webhook-certs)", name, key, configMapWait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// mintToken asks the API server for a token as the kubelet does for a projected
// serviceAccountToken: for the pod's ServiceAccount, the projection's audience and
// lifetime, bound to the pod by name and UID.
func (s *standIn) mintToken(ctx context.Context, pod *corev1.Pod, t *corev1.ServiceAccountTokenProjection) ([]byte, error) {
	if t.Audience == "" {
		return nil, errors.New("the projected token has no audience: the hand-off endpoint refuses the API server's own")
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		Audiences:         []string{t.Audience},
		ExpirationSeconds: t.ExpirationSeconds,
		BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	acct := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: pod.Namespace}}
	if err := s.c.SubResource("token").Create(ctx, acct, tr); err != nil {
		return nil, fmt.Errorf("minting a token of ServiceAccount %s bound to the pod: %w", sa, err)
	}
	return []byte(tr.Status.Token), nil
}

// asking is how many warm pods ask for a job now: asking began, no job came, the pod is not
// going, and no attempt failed lately (a client that failed may be waiting to try again).
// why describes the pods that do not, for a timeout's error.
func (s *standIn) asking(now time.Time) (n int, why []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.warm {
		switch {
		case w.gone || w.gaveUp || !w.handedOff.IsZero():
		case w.asking.IsZero():
			why = append(why, w.name+": not asking yet")
		case !w.failed.IsZero() && now.Sub(w.failed) < retryQuiet:
			why = append(why, fmt.Sprintf("%s: an attempt failed %s ago: %s", w.name, now.Sub(w.failed).Round(time.Millisecond), w.lastFailed))
		default:
			n++
		}
	}
	return n, why
}

// handedOff is the hand-off of each job the stand-in saw one of.
func (s *standIn) handedOff() map[string]handoffSeen {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]handoffSeen, len(s.handoffs))
	for k, v := range s.handoffs {
		out[k] = v
	}
	return out
}
