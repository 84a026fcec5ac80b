package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/buildkite/agent/v3/api"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/klauspost/compress/gzip"
)

// The chunk upload builds its request itself rather than through api.Client.UploadChunk,
// which makes a new gzip writer for every chunk: about 1.2 MB of compressor state to
// allocate and clear for a 100 KiB chunk, the largest cost of streaming a log (see
// docs/performance.md). Here the writers and their output buffers are kept and reset. The
// request is the one the agent sends: the same path, query and headers, and a refusal is
// the same *api.ErrorResponse, so StatusCode and IsPermanent read it alike.
//
// The compression level is not the agent's (the default): gzip is most of the supervisor's
// CPU, and BestSpeed took 12.2-13.9 ms of CPU per MB streamed where the default took
// 15.9-16.8 (BenchmarkSupervisorStream, alternating runs), for chunks 6 % larger (47 % of
// the log's size instead of 44 %). A job's supervisor shares the job's CPU; its upload
// bandwidth is rarely what limits it.

// gzipped is a gzip writer and the buffer it writes to, reused from chunk to chunk.
type gzipped struct {
	buf bytes.Buffer
	zw  *gzip.Writer
}

// gzipPool holds the writers of chunks not on their way: a stream has at most a few chunks
// in flight, so a few writers serve a whole job.
var gzipPool = sync.Pool{New: func() any {
	g := &gzipped{}
	g.zw, _ = gzip.NewWriterLevel(&g.buf, gzip.BestSpeed) // a valid level: no error
	return g
}}

func compress(data []byte) (*gzipped, error) {
	g := gzipPool.Get().(*gzipped)
	g.buf.Reset()
	g.zw.Reset(&g.buf)
	if _, err := g.zw.Write(data); err != nil {
		gzipPool.Put(g)
		return nil, fmt.Errorf("compressing: %w", err)
	}
	if err := g.zw.Close(); err != nil {
		gzipPool.Put(g)
		return nil, fmt.Errorf("compressing: %w", err)
	}
	return g, nil
}

// UploadChunk sends one piece of the job's log: sequence counts from 1, offset is the
// uncompressed byte offset of data in the whole log. It is gzipped on the way, as the agent
// does, and retried per the chunk policy.
func (c *Client) UploadChunk(ctx context.Context, jobID string, sequence, offset uint64, data []byte) error {
	err := c.uploadChunk(ctx, jobID, sequence, offset, data)
	return wrap(err, fmt.Sprintf("uploading log chunk %d of job %s", sequence, jobID))
}

func (c *Client) uploadChunk(ctx context.Context, jobID string, sequence, offset uint64, data []byte) error {
	g, err := compress(data)
	if err != nil {
		return err
	}
	// The transport may read the body after Do has returned (when the server answers
	// before the upload is complete): the guard cuts such a read short, so that the buffer
	// can go back to the pool.
	body := &guardedBody{data: g.buf.Bytes()}
	defer func() {
		body.close()
		gzipPool.Put(g)
	}()

	// The path and query of api.Client.UploadChunk. Rails does not accept dots in some path
	// segments, hence the escaped dot.
	u := strings.TrimRight(c.conf.Endpoint, "/") + "/jobs/" + strings.ReplaceAll(url.PathEscape(jobID), ".", "%2E") +
		fmt.Sprintf("/chunks?sequence=%d&offset=%d&size=%d", sequence, offset, len(data))
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, u, retryablehttp.ReaderFunc(body.reader))
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", c.conf.UserAgent)
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set("Content-Encoding", "gzip")
	req = req.WithContext(withToken(ctx, c.conf.Token))
	resp, err := c.calls.chunks.Do(req)
	if err != nil {
		return err
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	return responseError(resp)
}

// responseError is nil for a 2xx, else the error api.Client returns for resp: an
// *api.ErrorResponse with Buildkite's message, or the start of a body that is not one (a
// proxy's error page, say).
func responseError(resp *http.Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return nil
	}
	const maxSnippet = 512
	er := &api.ErrorResponse{Response: resp, ContentType: resp.Header.Get("Content-Type")}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || len(data) == 0 {
		return er
	}
	if err := json.Unmarshal(data, er); err != nil && !isJSON(er.ContentType) {
		if len(data) > maxSnippet {
			data = data[:maxSnippet]
		}
		er.Snippet = string(data)
	}
	return er
}

func isJSON(contentType string) bool {
	t, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return t == "application/json" || strings.HasPrefix(t, "application/") && strings.HasSuffix(t, "+json")
}

// guardedBody hands out readers of data, one per attempt, that fail once it is closed.
type guardedBody struct {
	mu     sync.Mutex
	data   []byte
	closed bool
}

var errBodyClosed = errors.New("log chunk upload is over")

func (b *guardedBody) reader() (io.Reader, error) {
	return &guardedReader{body: b}, nil
}

func (b *guardedBody) close() {
	b.mu.Lock()
	b.closed = true
	b.data = nil
	b.mu.Unlock()
}

type guardedReader struct {
	body *guardedBody
	off  int
}

// Len is what is left to read; retryablehttp takes the request's length from it.
func (r *guardedReader) Len() int {
	r.body.mu.Lock()
	defer r.body.mu.Unlock()
	return max(len(r.body.data)-r.off, 0)
}

func (r *guardedReader) Read(p []byte) (int, error) {
	b := r.body
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errBodyClosed
	}
	if r.off >= len(b.data) {
		return 0, io.EOF
	}
	n := copy(p, b.data[r.off:])
	r.off += n
	return n, nil
}
