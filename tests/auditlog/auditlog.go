// Package auditlog reads the API server's audit log (audit.k8s.io/v1 events, one JSON object a
// line), which the local node and the bench's API server write with Policy: who made which
// request, for the least-privilege check and the requests-per-job figures.
package auditlog

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Policy records every request's metadata and no bodies, so Secrets stay out of the log.
const Policy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
`

// Event is the part of an audit event the tests read.
type Event struct {
	AuditID   string `json:"auditID"`
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		APIGroup    string `json:"apiGroup"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestURI      string    `json:"requestURI"`
	RequestReceived time.Time `json:"requestReceivedTimestamp"`
	// Annotations hold the authorizer's decision ("authorization.k8s.io/decision": allow
	// or forbid) and its reason.
	Annotations map[string]string `json:"annotations"`
}

// ForbiddenByRBAC tells whether the authorizer refused the request, as opposed to a 403
// from admission (an exceeded ResourceQuota, Pod Security).
func (e *Event) ForbiddenByRBAC() bool {
	return e.Annotations["authorization.k8s.io/decision"] == "forbid"
}

// Resource is "pods", "buildjobs/status", or the path of a request with no object.
func (e *Event) Resource() string {
	if e.ObjectRef == nil {
		path, _, _ := strings.Cut(e.RequestURI, "?")
		return path
	}
	if e.ObjectRef.Subresource != "" {
		return e.ObjectRef.Resource + "/" + e.ObjectRef.Subresource
	}
	return e.ObjectRef.Resource
}

// Each calls fn with every event of r, in order, and stops at the first error.
func Each(r io.Reader, fn func(*Event) error) error {
	sc := bufio.NewScanner(r)
	// An event can be long (a request URI with a label selector, a long user agent).
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("reading an audit event: %w", err)
		}
		if err := fn(&e); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the audit log: %w", err)
	}
	return nil
}

// EachInFile is Each over the audit log at path.
func EachInFile(path string, fn func(*Event) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening the API server's audit log: %w", err)
	}
	defer func() { _ = f.Close() }()
	if err := Each(f, fn); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
