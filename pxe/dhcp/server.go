package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"

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
// received and sent on that interface only) with SO_BROADCAST set. The
// caller must be in the network namespace that holds iface.
func Listen(iface string, port int) (*net.UDPConn, error) {
	conn, err := server4.NewIPv4UDPConn(iface, &net.UDPAddr{IP: net.IPv4zero, Port: port})
	if err != nil {
		return nil, fmt.Errorf("dhcp: listen on %s port %d: %w", iface, port, err)
	}
	return conn, nil
}

// Serve reads requests from conn until ctx is done or conn fails, and
// answers them. It closes conn when ctx is done. The port conn is bound to
// matters: Destination answers requests to 4011 at their source.
func (s *Server) Serve(ctx context.Context, conn *net.UDPConn) error {
	if err := s.Config.Validate(); err != nil {
		return err
	}
	s.init()
	log := s.Log
	localPort := uint16(0)
	if la, ok := conn.LocalAddr().(*net.UDPAddr); ok {
		localPort = uint16(la.Port)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
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
			log.Debug("dhcp: ignored", "from", src, "reason", reason)
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
