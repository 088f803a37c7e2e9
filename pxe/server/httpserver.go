package server

import (
	"net/http"
	"time"
)

// httpLimits are the timeouts and header bound of gpuboot's HTTP servers (the plain
// boot port and the TLS port's REST API, rack view and gRPC).
type httpLimits struct {
	// Header bounds the time to read a request's headers (slowloris).
	Header time.Duration
	// Body bounds the time to read a request body, from the end of the headers. It is
	// set per request (only requests with a body get a deadline) rather than as
	// http.Server.ReadTimeout, which would also run during a long download: when it
	// fires there, the server's background read fails and cancels the request.
	Body time.Duration
	// Idle bounds how long a keep-alive connection waits for its next request.
	Idle time.Duration
	// MaxHeaderBytes bounds request headers (net/http's default is 1 MiB).
	MaxHeaderBytes int
}

// defaultHTTPLimits are gpuboot's. There is deliberately no write timeout: a rootfs of
// 141 MB at the 10 Mbit/s of a congested or BMC-shared link takes two minutes, and
// http.Server.WriteTimeout is a deadline on the whole response, not on progress, so
// any value short enough to matter would cut real downloads. A client that stops
// reading is bounded by TCP instead: once the send buffer is full, the kernel's
// retransmission and keep-alive timers close a dead peer.
var defaultHTTPLimits = httpLimits{
	Header:         10 * time.Second,
	Body:           60 * time.Second,
	Idle:           120 * time.Second,
	MaxHeaderBytes: 64 << 10,
}

// newHTTPServer returns an http.Server for h with the limits l.
func newHTTPServer(h http.Handler, l httpLimits) *http.Server {
	return &http.Server{
		Handler:           bodyDeadline(h, l.Body),
		ReadHeaderTimeout: l.Header,
		IdleTimeout:       l.Idle,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// bodyDeadline gives each request that has a body d to send it. Requests without a
// body (every GET of the boot port) get no read deadline, so a download is never cut.
// For HTTP/2 the deadline is the stream's, not the connection's.
func bodyDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
		}
		h.ServeHTTP(w, r)
	})
}
