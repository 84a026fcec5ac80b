package validation

import (
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"

	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// Where the operator mounts the Secrets of spec.git in the job's container.
const (
	GitSSHPath         = podcontract.GitSSHDir
	GitCredentialsPath = podcontract.GitCredentialsDir
)

// checkGit checks spec.git: the Secrets' names and keys, the https server of a username
// and password, and that the environment's own mounts leave the operator's paths free.
// Whether the jobs may read the Secrets is Privileges' concern (spec.allow.secrets).
func checkGit(spec *field.Path, env *bkv1.BuildEnvironment) field.ErrorList {
	var errs field.ErrorList
	g := &env.Spec.Git
	p := spec.Child("git")

	secretName := func(fp *field.Path, name string) {
		if len(k8svalidation.IsDNS1123Subdomain(name)) > 0 {
			errs = append(errs, field.Invalid(fp, name, "not a Secret name: lowercase letters, digits, '-' and '.', such as deploy-key"))
		}
	}
	secretKey := func(fp *field.Path, key string) {
		if key != "" && len(k8svalidation.IsConfigMapKey(key)) > 0 {
			errs = append(errs, field.Invalid(fp, key, "not a Secret key: letters, digits, '-', '_' and '.', such as ssh-privatekey"))
		}
	}
	mountTaken := func(at, what string) {
		for i, m := range env.Spec.VolumeMounts {
			if path.Clean(m.MountPath) == at {
				errs = append(errs, field.Invalid(spec.Child("volumeMounts").Index(i).Child("mountPath"), m.MountPath, fmt.Sprintf(
					"%s is where the operator mounts %s in the job's container; mount this volume elsewhere", at, what)))
			}
		}
	}

	if s := g.SSHSecret; s != nil {
		sp := p.Child("sshSecret")
		secretName(sp.Child("name"), s.Name)
		secretKey(sp.Child("keyKey"), s.KeyKey)
		secretKey(sp.Child("knownHostsKey"), s.KnownHostsKey)
		if s.KnownHostsKey != "" && s.KnownHostsKey == s.PrivateKeyKey() {
			errs = append(errs, field.Invalid(sp.Child("knownHostsKey"), s.KnownHostsKey,
				"names the key of the private key; the known_hosts lines need a key of their own, such as known_hosts"))
		}
		mountTaken(GitSSHPath, "spec.git.sshSecret")
	}
	if c := g.CredentialsSecret; c != nil {
		cp := p.Child("credentialsSecret")
		secretName(cp.Child("name"), c.Name)
		for _, k := range []struct{ field, key string }{{"key", c.Key}, {"usernameKey", c.UsernameKey}, {"passwordKey", c.PasswordKey}} {
			secretKey(cp.Child(k.field), k.key)
		}
		switch {
		case c.URL == "" && (c.UsernameKey != "" || c.PasswordKey != ""):
			errs = append(errs, field.Required(cp.Child("url"),
				"usernameKey and passwordKey need url, the https server the username and password are for, such as https://github.com"))
		case c.URL != "" && c.Key != "":
			errs = append(errs, field.Invalid(cp.Child("key"), c.Key,
				"a git-credentials file (key) names its servers itself; give either key, or url with a username and a password, not both"))
		case c.URL != "":
			if msg := credentialsURLProblem(c.URL); msg != "" {
				errs = append(errs, field.Invalid(cp.Child("url"), c.URL, msg))
			}
			if u, pw := c.UsernameAndPasswordKeys(); u == pw {
				errs = append(errs, field.Invalid(cp.Child("passwordKey"), pw, "names the key of the username; the password needs a key of its own, such as password"))
			}
		}
		mountTaken(GitCredentialsPath, "spec.git.credentialsSecret")
	}
	return errs
}

// credentialsURLProblem says what is wrong with the server of a username and password:
// "" for https://host or https://host:port.
func credentialsURLProblem(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Sprintf("not a URL (%v); give the https server, such as https://github.com", err)
	case u.Scheme != "https":
		return "must be an https URL, such as https://github.com: git sends the password to this server, and over plain http anyone on the way could read it (for an http server, put it in a git-credentials file with key instead)"
	case u.Host == "" || u.Opaque != "":
		return "names no server; give one such as https://github.com or https://git.example.com:8443"
	case u.User != nil:
		return "must not hold a user or password: they come from the Secret's usernameKey and passwordKey"
	case strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "":
		return "must be the server alone (https://github.com, not a repository or organization under it): git matches credentials by server"
	}
	return ""
}

// gitSSHEnv are the variables with which git picks its ssh command: an environment's env
// that sets one takes the place of the operator's, which uses the key of spec.git.
var gitSSHEnv = []string{"GIT_SSH_COMMAND", "GIT_SSH"}

// gitConfigEnv reports the variables of git's configuration from the environment
// (GIT_CONFIG_COUNT, GIT_CONFIG_KEY_n, GIT_CONFIG_VALUE_n), through which the operator gives
// git the credential helper of spec.git.credentialsSecret.
func gitConfigEnv(name string) bool {
	return name == "GIT_CONFIG_COUNT" || strings.HasPrefix(name, "GIT_CONFIG_KEY_") || strings.HasPrefix(name, "GIT_CONFIG_VALUE_")
}

// gitWarnings names settings that make spec.git do less than it seems to: no known_hosts
// (any server's key is taken), or the environment's own env replacing what the operator
// sets for git.
func gitWarnings(env *bkv1.BuildEnvironment) []string {
	var warnings []string
	g := &env.Spec.Git
	// setsEnv is the first variable of the environment's env that match reports.
	setsEnv := func(match func(string) bool) string {
		for _, e := range env.Spec.Env {
			if match(e.Name) {
				return e.Name
			}
		}
		return ""
	}
	if s := g.SSHSecret; s != nil {
		if s.KnownHostsKey == "" {
			warnings = append(warnings, fmt.Sprintf(
				"spec.git.sshSecret: no knownHostsKey, so ssh takes any server's host key unverified, and a server posing as yours gets the checkout; add the servers' known_hosts lines to Secret %q and name their key in knownHostsKey", s.Name))
		}
		if name := setsEnv(func(n string) bool { return slices.Contains(gitSSHEnv, n) }); name != "" {
			warnings = append(warnings, fmt.Sprintf(
				"spec.env sets %s, which replaces the ssh command that uses the key of spec.git.sshSecret (mounted at %s/%s): git will not use the key unless your command does",
				name, GitSSHPath, podcontract.GitSSHKeyFile))
		}
	}
	if g.CredentialsSecret != nil {
		if name := setsEnv(gitConfigEnv); name != "" {
			warnings = append(warnings, fmt.Sprintf(
				"spec.env sets %s, and the operator gives git the credential helper of spec.git.credentialsSecret through GIT_CONFIG_COUNT, GIT_CONFIG_KEY_n and GIT_CONFIG_VALUE_n: the environment's values replace the operator's, so the credentials may not be used",
				name))
		}
	}
	return warnings
}
