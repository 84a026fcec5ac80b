package fakebuildkite

import (
	"net/http"
	"strings"
)

// streamPingsPath is where agents from v3.122 on open the streaming ping (the ConnectRPC
// service agentedge.v1.AgentEdgeService, served at the root of the endpoint's host).
const streamPingsPath = "/agentedge.v1.AgentEdgeService/StreamPings"

// handleStreamPings answers the streaming ping as Buildkite does where it does not offer
// it: the RPC is unimplemented. The agent (`--ping-mode auto`, its default) takes that code
// as final, logs that it falls back to polling for good, and pings as older agents do;
// any other answer (a 404 page, a 405) would read as a passing outage, and the agent would
// keep retrying the stream with backoff for as long as it runs.
func (s *Server) handleStreamPings(w http.ResponseWriter, r *http.Request) {
	const msg = "the fake Buildkite does not offer streaming pings: poll GET /v3/ping"
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
		// gRPC (what the agent speaks): a trailers-only response, the status in the headers,
		// which a client reads over HTTP/1.1 as well as HTTP/2.
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		w.Header().Set("Grpc-Status", "12") // UNIMPLEMENTED
		w.Header().Set("Grpc-Message", msg)
		w.WriteHeader(http.StatusOK)
		return
	}
	// The Connect protocol: its error JSON, with the HTTP status of its code.
	writeJSON(w, http.StatusNotFound, map[string]string{"code": "unimplemented", "message": msg})
}
