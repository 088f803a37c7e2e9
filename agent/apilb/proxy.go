package apilb

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
)

// link is one client connection spliced to one upstream connection.
type link struct {
	client, server net.Conn
}

// close closes both connections; the splice copying between them then ends. Closing
// an already closed link does nothing more.
func (l *link) close() {
	l.client.Close()
	l.server.Close()
}

// splice copies between the two sides until both directions end. When one direction
// ends (its reader saw EOF or an error) it half-closes the other side's writer, so a
// FIN travels on as it came; when both have ended it closes both connections. With
// *net.TCPConn on both sides io.Copy moves the bytes with splice(2).
func (l *link) splice() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(l.server, l.client)
		closeWrite(l.server)
	}()
	_, _ = io.Copy(l.client, l.server)
	closeWrite(l.client)
	<-done
	l.close()
}

// closeWrite half-closes c's sending side when c supports it (TCP does).
func closeWrite(c net.Conn) {
	if hc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
	}
}

// handle serves one client connection: it connects it to an upstream and splices the
// two until both are done, or closes it when no upstream can be reached.
func (b *Balancer) handle(ctx context.Context, client net.Conn) {
	l, u := b.connect(ctx, client)
	if l == nil {
		client.Close()
		return
	}
	l.splice()
	b.mu.Lock()
	delete(u.links, l)
	b.mu.Unlock()
}

// candidate is an upstream to try, with its downs count when it was chosen.
type candidate struct {
	u     *upstream
	downs uint64
}

// candidates lists the upstreams to try for a new connection, in order: the healthy
// ones round-robin, starting from the next in turn, then the unhealthy ones in Config
// order, since their last check may be stale and a connection that might work is
// better than none. With no healthy upstream that is every upstream in Config order.
func (b *Balancer) candidates() []candidate {
	b.mu.Lock()
	defer b.mu.Unlock()
	var healthy, rest []candidate
	for _, u := range b.ups {
		c := candidate{u: u, downs: u.downs}
		if u.healthy {
			healthy = append(healthy, c)
		} else {
			rest = append(rest, c)
		}
	}
	if len(healthy) == 0 {
		return rest
	}
	i := int(b.next % uint64(len(healthy)))
	b.next++
	return slices.Concat(healthy[i:], healthy[:i], rest)
}

// Why register refused a link.
var (
	errClosing  = errors.New("the balancer is closing")
	errWentDown = errors.New("the upstream turned unhealthy during the dial")
)

// connect dials the candidates in turn, each within Config.Timeout, and returns the
// first link it could register, with its upstream. A failed dial marks its upstream
// unhealthy at once, so the next connections skip it before its next check. It returns
// nil when every candidate failed or Serve is ending.
func (b *Balancer) connect(ctx context.Context, client net.Conn) (*link, *upstream) {
	for _, c := range b.candidates() {
		server, err := b.dialer.DialContext(ctx, "tcp", c.u.addr)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			b.log.Warn("dial apiserver upstream failed; trying the next", "upstream", c.u.addr, "error", err)
			b.setHealth(c.u, err)
			continue
		}
		l := &link{client: client, server: server}
		switch err := b.register(c, l); {
		case err == nil:
			return l, c.u
		case errors.Is(err, errWentDown):
			server.Close() // its checks just failed; do not hand it a new client
			continue
		default:
			server.Close()
			return nil, nil
		}
	}
	if ctx.Err() == nil {
		b.log.Warn("no apiserver upstream reachable; closing the client connection",
			"client", client.RemoteAddr().String())
	}
	return nil, nil
}

// register records l as spliced to c's upstream, so that the upstream's failure or
// Serve's end closes it. It refuses while Serve is ending, and when the upstream went
// from healthy to unhealthy since c was chosen: setHealth has already closed that
// upstream's links and would not see this one.
func (b *Balancer) register(c candidate, l *link) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return errClosing
	}
	if c.u.downs != c.downs {
		return errWentDown
	}
	c.u.links[l] = struct{}{}
	return nil
}
