package agentapi

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"github.com/klauspost/compress/gzip"

	"github.com/buildkite-operator/buildkite-operator/pkg/logstream/logstreamtest"
)

// BenchmarkGzipFloor is the floor under the log stream's figures (docs/performance.md):
// what compressing the benchmarks' 200 MB of job output costs on this machine and nothing
// else, with no stream, redaction or HTTP.
//
//   - io.Copy: the output copied through one gzip writer at the chunks' level.
//   - chunks: the same cut into Buildkite's 100 KiB chunks, each compressed as an upload
//     compresses it (compress: a pooled writer, reset).
//
// LOGSTREAM_BENCH_MB changes the size.
func BenchmarkGzipFloor(b *testing.B) {
	size := 200_000_000
	if mb, err := strconv.Atoi(os.Getenv("LOGSTREAM_BENCH_MB")); err == nil && mb > 0 {
		size = mb * 1_000_000
	}
	data := logstreamtest.JobOutput(size, logstreamtest.Secrets(), 1)
	for _, bm := range []struct {
		name string
		run  func(b *testing.B) int
	}{
		{"io.Copy", func(b *testing.B) int {
			var n countingWriter
			zw, err := gzip.NewWriterLevel(&n, gzip.BestSpeed)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(zw, bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
			if err := zw.Close(); err != nil {
				b.Fatal(err)
			}
			return int(n)
		}},
		{"chunks", func(b *testing.B) int {
			out := 0
			for p := data; len(p) > 0; {
				n := min(len(p), 100<<10)
				g, err := compress(p[:n])
				if err != nil {
					b.Fatal(err)
				}
				out += g.buf.Len()
				gzipPool.Put(g)
				p = p[n:]
			}
			return out
		}},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.SetBytes(int64(size))
			var out int
			before := logstreamtest.CPUTime()
			for range b.N {
				out = bm.run(b)
			}
			cpu := logstreamtest.CPUTime() - before
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N)/(float64(size)/1e6), "cpu-ms/MB")
			b.ReportMetric(float64(out)/float64(size)*100, "%-compressed")
		})
	}
}

type countingWriter int

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}

// BenchmarkHeartbeat is what one call of a slot costs the operator, client side, over a
// kept connection: a thousand slots make hundreds a second. Its allocations per call are
// the figure to watch: while the api package's logger parsed the binary's build
// information twice per request they were 227 (17.0 KB) here, against 154 (13.0 KB), and
// far more in agentd, whose build information lists every module it is built from.
func BenchmarkHeartbeat(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	c := New(Config{Endpoint: srv.URL + "/v3"}).WithToken("agent")
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Heartbeat(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
