// Command pxebench is the load generator of test/bench/pxe.sh: it makes a
// signed test image and sends the same HTTP and TFTP load to `gpuboot serve`
// and to its peers (nginx, tftpd-hpa) side by side. DHCP load comes from
// perfdhcp. It is a benchmark tool, not part of gpuboot.
//
//	pxebench mkimage  -store DIR -size BYTES -pub FILE       prints the image id
//	pxebench httpload -url URL -c N                          prints one result line
//	pxebench tftpload -addr HOST:PORT -file NAME -c N -blksize B
//
// A result line reads "MiB/s MiB/s SECONDS s BYTES bytes FAILED failed".
package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pin/tftp/v3"

	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/pxe/httpboot/imagetest"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pxebench mkimage|httpload|tftpload [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "mkimage":
		err = mkimage(os.Args[2:])
	case "httpload":
		err = httpload(os.Args[2:])
	case "tftpload":
		err = tftpload(os.Args[2:])
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
	if *store == "" || *pubPath == "" || *size <= 0 {
		return fmt.Errorf("mkimage: want -store DIR -pub FILE and a positive -size")
	}
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

func httpload(args []string) error {
	fs := flag.NewFlagSet("httpload", flag.ExitOnError)
	url := fs.String("url", "", "URL to download")
	c := fs.Int("c", 160, "concurrent clients, one download each")
	fs.Parse(args)
	// Large reads keep the client's share of the CPU small, so that the
	// servers, not the load generator, set the pace on a small machine.
	tr := &http.Transport{MaxIdleConnsPerHost: *c, DisableCompression: true, ReadBufferSize: 64 << 10}
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
			buf := make([]byte, 1<<20)
			// Plain Reader and Writer: io.Discard's ReadFrom would read in 8 KiB pieces.
			n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, struct{ io.Reader }{resp.Body}, buf)
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
