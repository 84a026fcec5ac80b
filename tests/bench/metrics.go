package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Controller is what the operator's own metrics say of its BuildJob controller in the
// measured window: how often it reconciled a job, how long a reconcile took, and how long
// a job waited in the work queue for a free worker.
type Controller struct {
	Workers          int     `json:"workers"`
	ReconcilesPerJob float64 `json:"reconciles_per_job"`
	MeanReconcileMs  float64 `json:"mean_reconcile_ms"`
	MeanQueueWaitMs  float64 `json:"mean_queue_wait_ms"`
	// WorkersBusy is the share of the workers' time spent reconciling: near 1, jobs wait
	// for a worker.
	WorkersBusy float64 `json:"workers_busy"`
}

// metrics is one scrape of a Prometheus text endpoint: each series' value by its line's
// name and labels.
type metrics map[string]float64

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String(), nil
}

// scrape reads the metrics at http://addr/metrics.
func scrape(ctx context.Context, addr string) (metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping the operator's metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping the operator's metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format: comments are skipped, and each series
// line is "name{labels} value".
func parseMetrics(r io.Reader) (metrics, error) {
	m := metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

// sum adds up the series of metric name whose labels include label (`k="v"`).
func (m metrics) sum(name, label string) float64 {
	var total float64
	for series, v := range m {
		n, labels, _ := strings.Cut(series, "{")
		if n == name && strings.Contains(labels, label) {
			total += v
		}
	}
	return total
}

// controllerStats compares two scrapes, taken window apart, for jobs jobs.
func controllerStats(before, after metrics, window time.Duration, jobs int) Controller {
	const ctl, queue = `controller="buildjob"`, `name="buildjob"`
	delta := func(name, label string) float64 { return after.sum(name, label) - before.sum(name, label) }
	c := Controller{Workers: int(after.sum("controller_runtime_max_concurrent_reconciles", ctl))}
	if jobs > 0 {
		c.ReconcilesPerJob = delta("controller_runtime_reconcile_total", ctl) / float64(jobs)
	}
	busy := delta("controller_runtime_reconcile_time_seconds_sum", ctl)
	if n := delta("controller_runtime_reconcile_time_seconds_count", ctl); n > 0 {
		c.MeanReconcileMs = busy / n * 1000
	}
	if n := delta("workqueue_queue_duration_seconds_count", queue); n > 0 {
		c.MeanQueueWaitMs = delta("workqueue_queue_duration_seconds_sum", queue) / n * 1000
	}
	if c.Workers > 0 && window > 0 {
		c.WorkersBusy = busy / (float64(c.Workers) * window.Seconds())
	}
	return c
}
