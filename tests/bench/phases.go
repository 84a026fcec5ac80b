package bench

import (
	"slices"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// The moments of a job, in the order a job passes them.
const (
	tCreated    = iota // the job's build created (the fake's job record)
	tPing              // the ping whose answer handed the job out (the fake's request log)
	tAccepted          // accept (the fake's job record)
	tBuildJob          // the BuildJob appears in the bench's watch
	tPodCreated        // the pod appears in the bench's watch
	tPodRunning        // the watch shows the pod Running
	tStarted           // start reaches the fake (the fake's job record)
	tCommandEnd        // the command's last output reaches the fake (its request log)
	tFinished          // finish reaches the fake (the fake's job record)
	nMoments
)

// phaseDefs are the latencies reported, each between two moments. floor marks those a
// bare pod's create → running bounds from below. On the kwok backend the supervisor is
// the bench's stand-in, and the phases it times carry kwok's words instead of node's:
// they are the stand-in's figures, not the product's.
var phaseDefs = []struct {
	name       string
	from, to   int
	floor      bool
	kwok, node string
}{
	{"job created → ping hands it out: the wait for a free slot's ping", tCreated, tPing, false, "", ""},
	{"ping hands out the job → accepted", tPing, tAccepted, false, "", ""},
	{"accepted → BuildJob created", tAccepted, tBuildJob, false, "", ""},
	{"BuildJob created → pod created", tBuildJob, tPodCreated, false, "", ""},
	{"pod created → pod running", tPodCreated, tPodRunning, true, "", ""},
	{"pod running → supervisor start", tPodRunning, tStarted, false, " (the bench's stand-in supervisor)", ""},
	{"supervisor start → command end", tStarted, tCommandEnd, false, " (the stand-in)", ""},
	{"command end → finish received", tCommandEnd, tFinished, false,
		": the bench's stand-in supervisor, not the product's", ": the product's supervisor (target p99 < 500 ms)"},
	{pickupPhase, tAccepted, tStarted, true, "", ""},
	{"ping → finish received: the whole job", tPing, tFinished, false, "", ""},
	{"job created → finish received: the whole job, its wait included", tCreated, tFinished, false, "", ""},
}

// pickupPhase is the phase issue 16's pickup target is about.
const pickupPhase = "accepted → supervisor start: pickup (target p50 ≤ floor p50 + 0.5 s)"

// pickupOverFloor is the pickup p50 minus the floor p50 of the same run.
func pickupOverFloor(ps []Phase, floor Stats) float64 {
	for _, p := range ps {
		if p.Name == pickupPhase {
			return p.P50 - floor.P50
		}
	}
	return 0
}

// observed is what the bench's watch saw of one job's BuildJob and pod: their names, and
// when it saw each appear and the pod run.
type observed struct {
	buildJobName, podName            string
	buildJob, podCreated, podRunning time.Time
}

// jobMoments puts together the moments of each job from the fake's records, its request
// log and the watch.
func jobMoments(jobs []fakebuildkite.JobSnapshot, reqs []fakebuildkite.Request, seen map[string]observed) [][nMoments]time.Time {
	pings := map[string][]time.Time{}   // agent → its pings, in order
	lastChunk := map[string]time.Time{} // job → its last acknowledged chunk
	for _, r := range reqs {
		switch {
		case r.Endpoint == fakebuildkite.EPPing && r.AgentID != "":
			pings[r.AgentID] = append(pings[r.AgentID], r.Time)
		case r.Endpoint == fakebuildkite.EPChunks && r.Status/100 == 2 && r.Time.After(lastChunk[r.JobID]):
			lastChunk[r.JobID] = r.Time
		}
	}
	for _, ts := range pings {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	}
	out := make([][nMoments]time.Time, 0, len(jobs))
	for _, j := range jobs {
		var m [nMoments]time.Time
		m[tCreated] = j.CreatedAt
		m[tPing] = lastBefore(pings[j.AcceptedBy], j.AcceptedAt)
		m[tAccepted] = j.AcceptedAt
		o := seen[j.ID]
		m[tBuildJob], m[tPodCreated], m[tPodRunning] = o.buildJob, o.podCreated, o.podRunning
		m[tStarted] = j.StartedAt
		// Buildkite takes no chunk after finish, so the last one it took is the command's.
		m[tCommandEnd] = lastChunk[j.ID]
		m[tFinished] = j.FinishedAt
		out = append(out, m)
	}
	return out
}

// lastBefore is the latest of the sorted ts at or before t (zero when none is).
func lastBefore(ts []time.Time, t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	i, _ := slices.BinarySearchFunc(ts, t, func(a, b time.Time) int {
		if a.After(b) {
			return 1
		}
		return -1
	})
	if i == 0 {
		return time.Time{}
	}
	return ts[i-1]
}

// phases are the percentiles of each phase over the jobs that have both of its moments;
// standIn: the supervisor was the bench's stand-in (the kwok backend).
func phases(moments [][nMoments]time.Time, standIn bool) []Phase {
	out := make([]Phase, 0, len(phaseDefs))
	for _, d := range phaseDefs {
		name := d.name + d.node
		if standIn {
			name = d.name + d.kwok
		}
		var ds []time.Duration
		for _, m := range moments {
			if !m[d.from].IsZero() && !m[d.to].IsZero() {
				ds = append(ds, m[d.to].Sub(m[d.from]))
			}
		}
		out = append(out, Phase{Name: name, Stats: percentiles(ds), Floor: d.floor})
	}
	return out
}
