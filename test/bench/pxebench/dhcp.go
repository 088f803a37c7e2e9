package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/gpurack/gpurack/pxe/dhcp"
)

func dhcpserve(args []string) error {
	fs := flag.NewFlagSet("dhcpserve", flag.ExitOnError)
	iface := fs.String("iface", "", "interface")
	ip := fs.String("ip", "", "server IPv4 address on it")
	fs.Parse(args)
	addr, err := netip.ParseAddr(*ip)
	if err != nil {
		return err
	}
	conn, err := dhcp.Listen(*iface, 67)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := &dhcp.Server{Config: dhcp.Config{ServerIP: addr, ScriptURL: "http://" + *ip + ":8080/boot.ipxe"}}
	return s.Serve(ctx, conn)
}

// dhcpload broadcasts n PXE DHCPDISCOVERs (BIOS, distinct MACs and
// transaction ids) keeping at most window unanswered, and reports the
// OFFER rate and latency. A DISCOVER unanswered after 1 s counts as lost.
func dhcpload(args []string) error {
	fs := flag.NewFlagSet("dhcpload", flag.ExitOnError)
	iface := fs.String("iface", "", "interface")
	n := fs.Int("n", 20000, "DISCOVERs to send")
	window := fs.Int("window", 64, "outstanding DISCOVERs")
	fs.Parse(args)
	conn, err := dhcp.Listen(*iface, 68)
	if err != nil {
		return err
	}
	defer conn.Close()
	bcast := netip.MustParseAddrPort("255.255.255.255:67")
	var (
		mu      sync.Mutex
		sent    = map[uint32]time.Time{}
		lat     []time.Duration
		slots   = make(chan struct{}, *window)
		done    = make(chan struct{})
		answers int
	)
	go func() { // receiver
		buf := make([]byte, 1500)
		for {
			conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			k, _, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				close(done)
				return
			}
			p, err := dhcpv4.FromBytes(buf[:k])
			if err != nil || p.MessageType() != dhcpv4.MessageTypeOffer {
				continue
			}
			xid := uint32(p.TransactionID[0])<<24 | uint32(p.TransactionID[1])<<16 | uint32(p.TransactionID[2])<<8 | uint32(p.TransactionID[3])
			mu.Lock()
			if t0, ok := sent[xid]; ok {
				delete(sent, xid)
				lat = append(lat, time.Since(t0))
				answers++
				<-slots
			}
			mu.Unlock()
		}
	}()
	// Expire lost DISCOVERs so the window does not shrink.
	go func() {
		for {
			time.Sleep(100 * time.Millisecond)
			mu.Lock()
			for xid, t0 := range sent {
				if time.Since(t0) > time.Second {
					delete(sent, xid)
					<-slots
				}
			}
			mu.Unlock()
			select {
			case <-done:
				return
			default:
			}
		}
	}()
	start := time.Now()
	for i := range *n {
		slots <- struct{}{}
		xid := uint32(i + 1)
		mac := net.HardwareAddr{0x02, 0x00, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)}
		req, err := dhcpv4.New(
			dhcpv4.WithHwAddr(mac),
			dhcpv4.WithTransactionID(dhcpv4.TransactionID{byte(xid >> 24), byte(xid >> 16), byte(xid >> 8), byte(xid)}),
			dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover),
			dhcpv4.WithBroadcast(true),
			dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
			dhcpv4.WithOption(dhcpv4.OptClientArch(iana.INTEL_X86PC)),
		)
		if err != nil {
			return err
		}
		mu.Lock()
		sent[xid] = time.Now()
		mu.Unlock()
		if _, err := conn.WriteToUDPAddrPort(req.ToBytes(), bcast); err != nil {
			return err
		}
	}
	// Wait until every DISCOVER is answered or expired.
	for {
		mu.Lock()
		left := len(sent)
		mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	secs := time.Since(start).Seconds()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000
	}
	fmt.Printf("%.0f offers/s %.2f s p50 %.2f ms p99 %.2f ms %d lost\n", float64(answers)/secs, secs, pct(0.5), pct(0.99), *n-answers)
	return nil
}
