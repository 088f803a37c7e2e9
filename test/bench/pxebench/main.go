// Command pxebench is the driver of test/bench/pxe.sh: it runs gpuboot's
// HTTP and TFTP servers on their own (no inventory: every machine is held)
// and generates the load that the script points at gpuboot, nginx and
// tftpd-hpa side by side. It is a benchmark tool, not part of gpuboot.
//
//	pxebench mkimage  -store DIR -size BYTES -pub FILE       prints the image id
//	pxebench serve    -http ADDR -tftp ADDR -store DIR -pub FILE -ipxe DIR
//	pxebench httpload -url URL -c N                          prints one result line
//	pxebench tftpload -addr HOST:PORT -file NAME -c N -blksize B
//	pxebench dhcpserve -iface IF -ip ADDR                    proxyDHCP on port 67 only
//	pxebench dhcpload  -iface IF -n N -window W              PXE DHCPDISCOVERs, counts OFFERs
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pin/tftp/v3"

	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/pxe/httpboot"
	"github.com/gpurack/gpurack/pxe/httpboot/imagetest"
	"github.com/gpurack/gpurack/pxe/identity"
	pxetftp "github.com/gpurack/gpurack/pxe/tftp"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pxebench mkimage|serve|httpload|tftpload [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "mkimage":
		err = mkimage(os.Args[2:])
	case "serve":
		err = serve(os.Args[2:])
	case "httpload":
		err = httpload(os.Args[2:])
	case "tftpload":
		err = tftpload(os.Args[2:])
	case "dhcpserve":
		err = dhcpserve(os.Args[2:])
	case "dhcpload":
		err = dhcpload(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pxebench:", err)
		os.Exit(1)
	}
}

func mkimage(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ExitOnError)
	store := fs.String("store", "", "image store directory")
	size := fs.Int64("size", 256<<20, "size of rootfs.squashfs in bytes")
	pubPath := fs.String("pub", "", "write the signing public key here (PEM)")
	fs.Parse(args)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	data := make([]byte, *size)
	r := mrand.NewChaCha8([32]byte{1})
	r.Read(data)
	id, err := imagetest.Write(*store, priv, map[string][]byte{"rootfs.squashfs": data})
	if err != nil {
		return err
	}
	pem, err := manifest.MarshalPublicKeyPEM(pub)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*pubPath, pem, 0o644); err != nil {
		return err
	}
	fmt.Println(id)
	return nil
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	httpAddr := fs.String("http", "", "HTTP listen address")
	tftpAddr := fs.String("tftp", "", "TFTP listen address")
	store := fs.String("store", "", "image store")
	pubPath := fs.String("pub", "", "trusted public key (PEM)")
	ipxeDir := fs.String("ipxe", pxetftp.DefaultDir, "TFTP directory")
	fs.Parse(args)
	keys, err := manifest.LoadPublicKeys(*pubPath)
	if err != nil {
		return err
	}
	hold := httpboot.BooterFunc(func(context.Context, identity.Identity, netip.Addr) (httpboot.Target, error) {
		return httpboot.Target{Action: httpboot.Hold}, nil
	})
	h, err := httpboot.NewHandler(httpboot.Config{ImageStore: *store, TrustedKeys: keys, BaseURL: "http://" + *httpAddr}, hold)
	if err != nil {
		return err
	}
	ts, err := pxetftp.New(pxetftp.Config{Dir: *ipxeDir}, nil, nil)
	if err != nil {
		return err
	}
	conn, err := pxetftp.Listen(*tftpAddr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go ts.Serve(ctx, conn)
	srv := &http.Server{Addr: *httpAddr, Handler: h}
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		return err
	}
	return nil
}

func httpload(args []string) error {
	fs := flag.NewFlagSet("httpload", flag.ExitOnError)
	url := fs.String("url", "", "URL to download")
	c := fs.Int("c", 160, "concurrent clients, one download each")
	fs.Parse(args)
	tr := &http.Transport{MaxIdleConnsPerHost: *c, DisableCompression: true}
	client := &http.Client{Transport: tr}
	var total, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range *c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get(*url)
			if err != nil {
				failed.Add(1)
				return
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			total.Add(n)
			if err != nil || resp.StatusCode != 200 || (resp.ContentLength >= 0 && n != resp.ContentLength) {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	fmt.Printf("%.2f MiB/s %.2f s %d bytes %d failed\n", float64(total.Load())/secs/(1<<20), secs, total.Load(), failed.Load())
	return nil
}

func tftpload(args []string) error {
	fs := flag.NewFlagSet("tftpload", flag.ExitOnError)
	addr := fs.String("addr", "", "server host:port")
	file := fs.String("file", "ipxe.efi", "file to fetch")
	c := fs.Int("c", 160, "concurrent clients, one fetch each")
	blk := fs.Int("blksize", 1468, "blksize to ask for")
	fs.Parse(args)
	var total, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range *c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := tftp.NewClient(*addr)
			if err != nil {
				failed.Add(1)
				return
			}
			cl.SetBlockSize(*blk)
			cl.RequestTSize(true)
			cl.SetTimeout(2 * time.Second)
			cl.SetRetries(10)
			wt, err := cl.Receive(*file, "octet")
			if err != nil {
				failed.Add(1)
				return
			}
			n, err := wt.WriteTo(io.Discard)
			total.Add(n)
			if err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	fmt.Printf("%.2f MiB/s %.2f s %d bytes %d failed\n", float64(total.Load())/secs/(1<<20), secs, total.Load(), failed.Load())
	return nil
}
