package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// serverTimes are the moments the API server completed the writes that time a job's
// BuildJob and pod on the kwok backend, from its audit log: a BuildJob's create, a pod's
// create, and kwok's first status write of the pod, which makes it Running (bench-pod-running
// in kwokConfig). They do not depend on how quickly the bench's own watch keeps up: on a
// busy machine the watch falls behind, and then sees a pod's create and its Running
// together. On the node backend a kubelet writes a pod's status several times and the log
// holds no bodies, so which write made it Running cannot be told: the watch times it there.
//
// A warm pod's assignment to a job is agentd's first patch of the pod: the warm pool's
// keeper only creates and deletes its pods. agentd is told by its user on kwok, by its user
// agent on the node, where it shares the admin's user with the bench (clientName).
type serverTimes struct {
	buildJobCreated, podCreated, podRunning, podPatched map[string]time.Time // by object name
}

// serverEvent is what serverTimes reads of an audit event.
type serverEvent struct {
	Stage     string `json:"stage"`
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	// StageTimestamp is when the stage ended: for ResponseComplete, the write is done and
	// watchers can see it.
	StageTimestamp time.Time `json:"stageTimestamp"`
}

// readServerTimes reads the audit log at path.
func readServerTimes(path string) (serverTimes, error) {
	f, err := os.Open(path)
	if err != nil {
		return serverTimes{}, fmt.Errorf("opening the API server's audit log: %w", err)
	}
	defer func() { _ = f.Close() }()
	st, err := parseServerTimes(f)
	if err != nil {
		return serverTimes{}, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// parseServerTimes keeps the first successful write of each kind to each object of the
// bench's namespace.
func parseServerTimes(r io.Reader) (serverTimes, error) {
	st := serverTimes{buildJobCreated: map[string]time.Time{}, podCreated: map[string]time.Time{}, podRunning: map[string]time.Time{}, podPatched: map[string]time.Time{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var e serverEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return st, fmt.Errorf("reading an audit event: %w", err)
		}
		o := e.ObjectRef
		if e.Stage != "ResponseComplete" || o == nil || o.Namespace != namespace || o.Name == "" ||
			e.ResponseStatus == nil || e.ResponseStatus.Code/100 != 2 {
			continue
		}
		var into map[string]time.Time
		switch {
		case e.Verb == "create" && o.Resource == "buildjobs" && o.Subresource == "":
			into = st.buildJobCreated
		case e.Verb == "create" && o.Resource == "pods" && o.Subresource == "":
			into = st.podCreated
		case (e.Verb == "patch" || e.Verb == "update") && o.Resource == "pods" && o.Subresource == "status" &&
			e.User.Username == userPrefix+"kwok":
			into = st.podRunning
		case e.Verb == "patch" && o.Resource == "pods" && o.Subresource == "" && clientName(e.User.Username, e.UserAgent) == operatorClient:
			into = st.podPatched
		default:
			continue
		}
		if _, ok := into[o.Name]; !ok {
			into[o.Name] = e.StageTimestamp
		}
	}
	return st, sc.Err()
}

// apply puts the server's moments in place of the watch's, where the log has them.
func (st serverTimes) apply(seen map[string]observed) map[string]observed {
	out := make(map[string]observed, len(seen))
	for id, o := range seen {
		if t, ok := st.buildJobCreated[o.buildJobName]; ok {
			o.buildJob = t
		}
		if t, ok := st.podCreated[o.podName]; ok {
			o.podCreated = t
		}
		if t, ok := st.podRunning[o.podName]; ok {
			o.podRunning = t
		}
		out[id] = o
	}
	return out
}

// barePods is the floor from the server's moments: each of the n bare pods' create →
// running, and false unless the log has both moments of every one.
func (st serverTimes) barePods(n int) (Stats, bool) {
	ds := make([]time.Duration, 0, n)
	for i := range n {
		name := barePodName(i)
		created, ok1 := st.podCreated[name]
		running, ok2 := st.podRunning[name]
		if !ok1 || !ok2 {
			return Stats{}, false
		}
		ds = append(ds, running.Sub(created))
	}
	return percentiles(ds), true
}
