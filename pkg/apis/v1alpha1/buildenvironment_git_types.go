package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Keys a git Secret is read from when the environment names none: those of the Secret
// types Kubernetes defines for them (kubernetes.io/ssh-auth and kubernetes.io/basic-auth),
// and the file git's credential store keeps.
const (
	DefaultGitSSHKeyKey      = corev1.SSHAuthPrivateKey
	DefaultGitCredentialsKey = ".git-credentials"
	DefaultGitUsernameKey    = corev1.BasicAuthUsernameKey
	DefaultGitPasswordKey    = corev1.BasicAuthPasswordKey
)

// GitSettings are the credentials the checkout's git (and the git of plugin checkouts) uses
// for private repositories. Each Secret is mounted read-only into the job's container only,
// and, being a Secret the jobs can read, must be listed in spec.allow.secrets (which needs
// the verb grant and get on the Secret, as every Secret an environment gives its jobs).
type GitSettings struct {
	// SSHSecret names a Secret with an SSH private key for repositories reached over SSH
	// (git@github.com:acme/app.git, ssh://git@git.example.com/app.git), and optionally the
	// known_hosts lines of their servers.
	// +optional
	SSHSecret *GitSSHSecret `json:"sshSecret,omitempty"`
	// CredentialsSecret names a Secret with credentials for repositories reached over https.
	// +optional
	CredentialsSecret *GitCredentialsSecret `json:"credentialsSecret,omitempty"`
}

// GitSSHSecret is a Secret holding an SSH private key, such as one made with
// `kubectl create secret generic deploy-key --type=kubernetes.io/ssh-auth
// --from-file=ssh-privatekey=id_ed25519 --from-file=known_hosts=known_hosts`.
type GitSSHSecret struct {
	// Name of the Secret, in the environment's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// KeyKey is the key of the private key (OpenSSH or PEM, without a passphrase);
	// "ssh-privatekey", the key of a kubernetes.io/ssh-auth Secret, when empty.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	KeyKey string `json:"keyKey,omitempty"`
	// KnownHostsKey is the key of the servers' known_hosts lines (what `ssh-keyscan
	// github.com` prints, checked against what the host publishes). With it, ssh connects
	// only to a server whose host key is listed (StrictHostKeyChecking=yes); without it, a
	// server's key is taken unverified, as the agent's ssh-keyscan does on a new agent.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	KnownHostsKey string `json:"knownHostsKey,omitempty"`
}

// PrivateKeyKey is the key of the private key: KeyKey, or DefaultGitSSHKeyKey.
func (s *GitSSHSecret) PrivateKeyKey() string {
	if s.KeyKey == "" {
		return DefaultGitSSHKeyKey
	}
	return s.KeyKey
}

// GitCredentialsSecret is a Secret holding credentials for git over https: either a
// git-credentials file (key), or, with url, a username and a password (or token) for that
// server alone, as a kubernetes.io/basic-auth Secret holds them.
// +kubebuilder:validation:XValidation:rule="!(has(self.key) && has(self.url))",message="credentialsSecret takes key (a git-credentials file) or url (with a username and a password), not both"
// +kubebuilder:validation:XValidation:rule="has(self.url) || !(has(self.usernameKey) || has(self.passwordKey))",message="credentialsSecret.usernameKey and passwordKey need url: the https server the username and password are for"
type GitCredentialsSecret struct {
	// Name of the Secret, in the environment's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key is the key of a git-credentials file: one https://<user>:<password or
	// token>@<host> line per server, as `git credential-store` writes it (characters such
	// as @ and : in a password percent-encoded). ".git-credentials" when empty, unless url
	// is set.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	Key string `json:"key,omitempty"`
	// URL is the https server (https://host or https://host:port, no path) that the
	// Secret's username and password are for: with it, git gives them to that server only.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	URL string `json:"url,omitempty"`
	// UsernameKey is the key of the username, with url; "username" when empty.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	UsernameKey string `json:"usernameKey,omitempty"`
	// PasswordKey is the key of the password or token, with url; "password" when empty.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	PasswordKey string `json:"passwordKey,omitempty"`
}

// FileKey is the key of the git-credentials file: Key, or DefaultGitCredentialsKey; ""
// when the Secret holds a username and a password (URL is set).
func (s *GitCredentialsSecret) FileKey() string {
	switch {
	case s.URL != "":
		return ""
	case s.Key == "":
		return DefaultGitCredentialsKey
	}
	return s.Key
}

// UsernameAndPasswordKeys are the keys of the username and the password, with their
// defaults; both "" when the Secret holds a git-credentials file (URL is not set).
func (s *GitCredentialsSecret) UsernameAndPasswordKeys() (username, password string) {
	if s.URL == "" {
		return "", ""
	}
	username, password = s.UsernameKey, s.PasswordKey
	if username == "" {
		username = DefaultGitUsernameKey
	}
	if password == "" {
		password = DefaultGitPasswordKey
	}
	return username, password
}
