package image

import (
	"context"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// The operator image's fixed facts. The chart's securityContext and the job pods' install
// init container rely on them.
const (
	// NonRootUID runs the operator and the install init container (the distroless
	// "nonroot" user's number, so policies written for those images fit this one).
	NonRootUID = 65532
	// AgentdPath and SupervisorPath are where the image keeps agentd and agentd-supervise;
	// the job pods' install init container copies the supervisor. buildkite-agent is not
	// here: job pods copy it from the agent's own image (Buildkite's buildkite/agent, or
	// one the platform team picks), so its release is theirs to choose.
	AgentdPath     = "/usr/local/bin/agentd"
	SupervisorPath = podcontract.ImageSupervisorPath
	// SourceURL is the project's repository, for the OCI source label.
	SourceURL = "https://github.com/buildkite-operator/buildkite-operator"
	// caBundle is where Debian keeps the CA certificates, and where Go's TLS looks first.
	caBundle = "/etc/ssl/certs/ca-certificates.crt"
)

// OperatorOptions are the inputs of the operator image.
type OperatorOptions struct {
	// Agentd is a static agentd binary (CGO_ENABLED=0), its version set at build time.
	Agentd string
	// Supervisor is a static agentd-supervise binary (./cmd/agentd-supervise), which job
	// containers run.
	Supervisor string
	// Version and Revision label the image (org.opencontainers.image.version, .revision).
	Version, Revision string
	// CABundle overrides the host's CA certificates file; caBundle when empty.
	CABundle string
}

// Operator is the recipe of the operator's image: static agentd and agentd-supervise, CA
// certificates, a non-root user, and nothing else (no shell): agentd is the entrypoint of
// the operator's Deployment and of the job pods' install init container.
func Operator(ctx context.Context, o OperatorOptions) (Spec, error) {
	for _, bin := range []string{o.Agentd, o.Supervisor} {
		if err := RequireStatic(bin); err != nil {
			return Spec{}, fmt.Errorf("%w: build it with CGO_ENABLED=0 (make image does)", err)
		}
	}
	bundle := o.CABundle
	if bundle == "" {
		bundle = caBundle
	}
	if _, err := os.Stat(bundle); err != nil {
		return Spec{}, fmt.Errorf("CA certificates not found at %s (apt-get install ca-certificates): %w", bundle, err)
	}
	version := o.Version
	if version == "" {
		version = "dev"
	}
	return Spec{
		Files: []File{
			{Path: "/etc/passwd", Data: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRootUID, NonRootUID)},
			{Path: "/etc/group", Data: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", NonRootUID)},
			{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: NonRootUID, GID: NonRootUID},
			{Path: "/tmp", Dir: true, Mode: 0o777 | fs.ModeSticky},
			{Path: caBundle, Source: bundle, Mode: 0o644},
			{Path: AgentdPath, Source: o.Agentd, Mode: 0o755},
			{Path: SupervisorPath, Source: o.Supervisor, Mode: 0o755},
		},
		Env:        []string{DefaultPath, "HOME=/home/nonroot", "SSL_CERT_FILE=" + caBundle},
		Entrypoint: []string{AgentdPath},
		User:       fmt.Sprintf("%d:%d", NonRootUID, NonRootUID),
		Labels: map[string]string{
			"org.opencontainers.image.title":       "buildkite-operator",
			"org.opencontainers.image.description": "Runs Buildkite CI jobs as Kubernetes pods: agentd (operator, install) and agentd-supervise",
			"org.opencontainers.image.source":      SourceURL,
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.revision":    o.Revision,
		},
	}, nil
}

// RequireStatic fails for a program that is not a statically linked ELF executable: it
// would not run in an image without its libraries.
func RequireStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s is not an ELF program: %w", p, err)
	}
	defer func() { _ = f.Close() }()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", p)
		}
	}
	return nil
}
