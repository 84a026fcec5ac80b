package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// A warm pod (BuildEnvironment spec.warmPool) starts before it has a job: its supervisor
// waits at the operator's hand-off endpoint (pkg/handoff) until the controller assigns it
// one, then runs that job exactly as a job pod's supervisor runs its own, with the job's
// env over the pod's. The hand-off settings are in the pod's env only; the job never sees
// them.

// handoffEnv are the hand-off's settings: they are the warm pod's, not the job's.
var handoffEnv = []string{podcontract.EnvHandoffURL, podcontract.EnvHandoffTokenPath, podcontract.EnvHandoffCAPath}

// isWarm tells whether env is a warm pod's: one that must fetch its job first.
func isWarm(env []string) bool { return lookup(env, podcontract.EnvHandoffURL) != "" }

// receiveJob waits, for as long as ctx lasts (a warm pod waits until it is given a job or
// deleted), for the warm pod's job, and returns the environment to run it with. When it
// returns ok false the supervisor exits with code: 0 when ctx ended first (the pod was
// deleted while it had no job: nothing to report to anyone), 1 when no job could be had,
// which it records in the progress record beginning with podcontract.HandoffFailedPrefix.
func receiveJob(ctx context.Context, env []string, stderr io.Writer) (jobEnv []string, code int, ok bool) {
	logf := func(format string, args ...any) {
		_, _ = fmt.Fprintf(stderr, "agentd supervise: "+format+"\n", args...)
	}
	fail := func(err error) ([]string, int, bool) {
		err = errors.New(podcontract.HandoffFailedPrefix + err.Error())
		logf("%v", err)
		path := lookup(env, podcontract.EnvProgressPath)
		if path == "" {
			path = jobprogress.DefaultPath
		}
		rec := &recorder{path: path, logf: logf}
		rec.failed(err)
		rec.close()
		return nil, 1, false
	}
	c := &handoffclient.Client{
		URL:       lookup(env, podcontract.EnvHandoffURL),
		TokenPath: lookup(env, podcontract.EnvHandoffTokenPath),
		CAPath:    lookup(env, podcontract.EnvHandoffCAPath),
		Logf:      logf,
	}
	if c.TokenPath == "" {
		return fail(fmt.Errorf("%s is set but %s is not: mount the pod's projected ServiceAccount token for the hand-off and give its file", podcontract.EnvHandoffURL, podcontract.EnvHandoffTokenPath))
	}
	logf("warm pod: waiting for a job from %s", c.URL)
	job, err := c.Fetch(ctx)
	var refused *handoffclient.RefusedError
	switch {
	case errors.As(err, &refused):
		return fail(err)
	case err != nil && ctx.Err() != nil:
		logf("warm pod: stopped while waiting for a job (the pod is being deleted); no job was handed off, so there is nothing to report")
		return nil, 0, false
	case err != nil:
		return fail(err)
	}
	logf("warm pod: job %s (BuildJob %s) handed off", job.ID, job.BuildJob)
	jobEnv, err = warmJobEnv(env, job)
	if err != nil {
		return fail(err)
	}
	// The supervisor's own process takes the job's environment too, as a job pod's has it
	// from the kubelet: what it resolves itself (commands on PATH, TMPDIR for the env
	// files) is then the job's, and the hand-off's settings are gone from it as well.
	if err := setProcessEnv(jobEnv); err != nil {
		return fail(err)
	}
	return jobEnv, 0, true
}

// setProcessEnv makes env the process's environment.
func setProcessEnv(env []string) error {
	os.Clearenv()
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if err := os.Setenv(k, v); err != nil {
			return fmt.Errorf("setting %s in the supervisor's environment: %w", k, err)
		}
	}
	return nil
}

// warmJobEnv is the environment a warm pod runs job with, as a job pod's would be: the
// pod's own (own) without the hand-off's settings, with the job's env over it (its
// variables replace the pod's of the same name), its ID and command where its env does not
// give them, and its token in podcontract.EnvAccessToken.
func warmJobEnv(own []string, job handoffclient.Job) ([]string, error) {
	if job.ID == "" {
		return nil, errors.New("the hand-off gave no job ID")
	}
	var bad []string
	for k, v := range job.Env {
		switch {
		case k == "":
			bad = append(bad, "a variable with no name")
		case strings.Contains(k, "="):
			// Only the part before the '=': the rest might be a value.
			name, _, _ := strings.Cut(k, "=")
			bad = append(bad, fmt.Sprintf("%q… (a name holding '=')", name))
		case strings.Contains(k, "\x00"):
			bad = append(bad, fmt.Sprintf("%q (a name holding NUL)", k))
		case strings.Contains(v, "\x00"):
			bad = append(bad, fmt.Sprintf("%s (a value holding NUL)", k))
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return nil, fmt.Errorf("the job's env from the hand-off has variables no process can be given: %s", strings.Join(bad, ", "))
	}
	for _, f := range []struct{ name, value string }{{podcontract.EnvJobID, job.ID}, {podcontract.EnvCommand, job.Command}} {
		if v, ok := job.Env[f.name]; ok && f.value != "" && v != f.value {
			return nil, fmt.Errorf("the hand-off is inconsistent: its job's %s is not the job's own", f.name)
		}
	}

	// The job's variables, with what the hand-off gives beside them, replace the pod's.
	overlay := maps.Clone(job.Env)
	if overlay == nil {
		overlay = map[string]string{}
	}
	for _, k := range handoffEnv {
		delete(overlay, k)
	}
	if _, ok := overlay[podcontract.EnvJobID]; !ok {
		overlay[podcontract.EnvJobID] = job.ID
	}
	if _, ok := overlay[podcontract.EnvCommand]; !ok && job.Command != "" {
		overlay[podcontract.EnvCommand] = job.Command
	}
	if job.Token != "" {
		overlay[podcontract.EnvAccessToken] = job.Token
	}
	env := make([]string, 0, len(own)+len(overlay))
	for _, kv := range own {
		k, _, _ := strings.Cut(kv, "=")
		if _, replaced := overlay[k]; !replaced && !slices.Contains(handoffEnv, k) {
			env = append(env, kv)
		}
	}
	// Sorted, so that the job's processes see the same environment every time.
	for _, k := range slices.Sorted(maps.Keys(overlay)) {
		env = append(env, k+"="+overlay[k])
	}
	return env, nil
}
