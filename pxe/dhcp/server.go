package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/prometheus/client_golang/prometheus"
)

// PXEPort is the proxyDHCP / boot server port (PXE 2.1 §2.2.6).
const PXEPort = 4011

// Metrics are the DHCP counters. Create them once with NewMetrics.
type Metrics struct {
	Replies *prometheus.CounterVec // labels: type (offer, ack, nak), client (ipxe, bios, efi, httpboot, none), port (67, 4011)
	Ignores *prometheus.CounterVec // label: reason
}

// NewMetrics creates the DHCP metrics and registers them with reg (nil:
// not registered). Every ignore reason starts at 0, so alerts see it.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Replies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuboot_dhcp_replies_total", Help: "DHCP replies sent, by message type, client kind and the port the request came to.",
		}, []string{"type", "client", "port"}),
		Ignores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuboot_dhcp_ignored_total", Help: "DHCP requests that got no reply, by reason.",
		}, []string{"reason"}),
	}
	for _, r := range Reasons {
		m.Ignores.WithLabelValues(string(r))
	}
	if reg != nil {
		reg.MustRegister(m.Replies, m.Ignores)
	}
	return m
}

// Server runs Decide on the datagrams of one or more sockets.
type Server struct {
	Config  Config
	Metrics *Metrics     // nil: NewMetrics(nil), unregistered
	Log     *slog.Logger // nil: slog.Default()

	once sync.Once
}

func (s *Server) init() {
	s.once.Do(func() {
		if s.Metrics == nil {
			s.Metrics = NewMetrics(nil)
		}
		if s.Log == nil {
			s.Log = slog.Default()
		}
	})
}

// Listen opens a UDP socket for DHCP on port (67 or 4011) bound to the
// network interface iface (SO_BINDTODEVICE, so that broadcasts are
// received and sent on that interface only) with SO_BROADCAST set and a
// receive buffer of ReceiveBuffer bytes. The caller must be in the network
// namespace that holds iface.
func Listen(iface string, port int) (*net.UDPConn, error) {
	conn, err := server4.NewIPv4UDPConn(iface, &net.UDPAddr{IP: net.IPv4zero, Port: port})
	if err != nil {
		return nil, fmt.Errorf("dhcp: listen on %s port %d: %w", iface, port, err)
	}
	setReceiveBuffer(conn, ReceiveBuffer)
	return conn, nil
}

// ReceiveBuffer is the socket receive buffer Listen asks for: room for
// about 8000 queued requests (each costs a few KiB of kernel memory), so a
// boot storm of thousands of requests a second rides out the moments the
// server is not scheduled, instead of the kernel dropping what does not
// fit in the default of about 200 KiB.
const ReceiveBuffer = 16 << 20

// setReceiveBuffer sets SO_RCVBUFFORCE, which may exceed the
// net.core.rmem_max limit but needs CAP_NET_ADMIN, and falls back to
// SO_RCVBUF, which the kernel caps at rmem_max. Failure leaves the default
// buffer: the server still works, only drops sooner under load.
func setReceiveBuffer(conn *net.UDPConn, n int) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, n)
	}); err != nil || serr != nil {
		conn.SetReadBuffer(n)
	}
}

// Serve reads requests from conn until ctx is done or conn fails, and
// answers them. It closes conn when ctx is done. The port conn is bound to
// matters: Destination answers requests to 4011 at their source.
//
// One reader per CPU (GOMAXPROCS) reads, handles and answers datagrams
// side by side, so one request waiting for the pool's lock or a slow log
// write does not hold up the socket.
func (s *Server) Serve(ctx context.Context, conn *net.UDPConn) error {
	if err := s.Config.Validate(); err != nil {
		return err
	}
	s.init()
	localPort := uint16(0)
	if la, ok := conn.LocalAddr().(*net.UDPAddr); ok {
		localPort = uint16(la.Port)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	workers := runtime.GOMAXPROCS(0)
	errs := make(chan error, workers)
	for range workers {
		go func() { errs <- s.serveConn(ctx, conn, localPort) }()
	}
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// serveConn is one reader of Serve: it returns when conn is closed.
func (s *Server) serveConn(ctx context.Context, conn *net.UDPConn, localPort uint16) error {
	log := s.Log
	buf := make([]byte, 4096)
	for {
		n, src, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			log.Warn("dhcp: read", "err", err)
			continue
		}
		reply, dst, reason := s.Handle(buf[:n], netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), localPort)
		if reply == nil {
			if log.Enabled(ctx, slog.LevelDebug) {
				log.Debug("dhcp: ignored", "from", src, "reason", reason)
			}
			continue
		}
		if _, err := conn.WriteToUDPAddrPort(reply.ToBytes(), dst); err != nil {
			log.Warn("dhcp: send reply", "to", dst, "err", err)
		}
	}
}

// Handle is the edge between the socket loop and the decision: it parses one
// datagram, lets Decide (pure, apart from cfg.Leases in full mode) choose the
// reply, counts the outcome in Metrics, logs a reply at Info, and returns the
// reply and its destination, or the ignore reason. It sends nothing: Serve
// writes the reply.
func (s *Server) Handle(pkt []byte, src netip.AddrPort, localPort uint16) (*dhcpv4.DHCPv4, netip.AddrPort, Reason) {
	s.init()
	req, err := dhcpv4.FromBytes(pkt)
	if err != nil {
		s.Metrics.Ignores.WithLabelValues(string(ReasonMalformed)).Inc()
		return nil, netip.AddrPort{}, ReasonMalformed
	}
	reply, kind, reason := decide(req, s.Config)
	if reply == nil {
		s.Metrics.Ignores.WithLabelValues(string(reason)).Inc()
		return nil, netip.AddrPort{}, reason
	}
	s.Metrics.Replies.WithLabelValues(strings.ToLower(reply.MessageType().String()), string(kind), strconv.Itoa(int(localPort))).Inc()
	if s.Log.Enabled(context.Background(), slog.LevelInfo) {
		s.Log.Info("dhcp: reply", "type", reply.MessageType(), "mac", req.ClientHWAddr.String(), "client", kind,
			"file", reply.BootFileNameOption(), "yiaddr", reply.YourIPAddr, "port", localPort)
	}
	return reply, Destination(req, reply, src, localPort), ReasonNone
}
