package httpboot

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurack/gpurack/pxe/httpboot/imagetest"
	"github.com/gpurack/gpurack/pxe/identity"
)

const testPin = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// fakeBooter is the in-test Booter: it boots approved MACs into image and
// holds the rest, recording what it was asked.
type fakeBooter struct {
	mu       sync.Mutex
	image    string
	approved map[string]bool
	seen     []identity.Identity
}

func (b *fakeBooter) BootTarget(_ context.Context, id identity.Identity, _ netip.Addr) (Target, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seen = append(b.seen, id)
	if b.approved[id.MAC] {
		return Target{Action: Boot, ImageID: b.image, ExtraArgs: []string{"gpurack.rack=r1"}}, nil
	}
	return Target{Action: Hold}, nil
}

type fixture struct {
	store   string
	pub     ed25519.PublicKey
	priv    ed25519.PrivateKey
	image   string
	kernel  []byte
	booter  *fakeBooter
	handler *Handler
	srv     *httptest.Server
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{store: t.TempDir(), pub: pub, priv: priv}
	f.kernel = make([]byte, 100_000)
	rand.Read(f.kernel)
	f.image, err = imagetest.Write(f.store, priv, map[string][]byte{
		"vmlinuz": f.kernel,
		"cmdline": []byte("console=ttyS0,115200 gpurack.rootfs.sha256=" + strings.Repeat("a", 64) + "\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	f.booter = &fakeBooter{image: f.image, approved: map[string]bool{"52:54:00:12:34:56": true}}
	f.handler, err = NewHandler(Config{
		ImageStore:  f.store,
		TrustedKeys: []ed25519.PublicKey{pub},
		BaseURL:     "http://10.88.0.1:8080",
		EnrollAddr:  "10.88.0.1:8443",
		EnrollCAPin: testPin,
		IPXEDir:     t.TempDir(),
	}, f.booter)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.handler)
	t.Cleanup(f.srv.Close)
	return f
}

func get(t *testing.T, url string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

func TestBootIPXE(t *testing.T) {
	f := newFixture(t)
	// First request: no identity yet, iPXE is told to send it.
	resp, body := get(t, f.srv.URL+"/boot.ipxe")
	if resp.StatusCode != 200 || !strings.Contains(string(body), "chain --replace --autofree http://10.88.0.1:8080/boot.ipxe?mac=${net0/mac}&uuid=${uuid}&serial=${serial:uristring}") {
		t.Fatalf("identify: %d\n%s", resp.StatusCode, body)
	}
	// An approved machine boots its image with the CONTRACTS §3 arguments.
	resp, body = get(t, f.srv.URL+"/boot.ipxe?mac=52-54-00-12-34-56&uuid=4C4C4544-0042-3510-8052-B4C04F565331&serial=Default%20string")
	script := string(body)
	base := "http://10.88.0.1:8080/images/" + f.image + "/"
	for _, want := range []string{
		"#!ipxe\n",
		"kernel " + base + "vmlinuz console=ttyS0,115200 gpurack.rootfs.sha256=",
		" gpurack.rack=r1 initrd=initrd.img gpurack.rootfs=" + base + "rootfs.squashfs BOOTIF=01-${net0/mac:hexhyp} gpurack.enroll=10.88.0.1:8443 gpurack.enroll.ca=" + testPin + " ",
		"initrd " + base + "initrd.img",
		"boot",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("boot script lacks %q:\n%s", want, script)
		}
	}
	if resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
	f.booter.mu.Lock()
	got := f.booter.seen[0]
	f.booter.mu.Unlock()
	if got.Key() != "52:54:00:12:34:56|4c4c4544-0042-3510-8052-b4c04f565331|" {
		t.Errorf("booter saw identity %q; want the normalised one (placeholder serial absent)", got.Key())
	}
	// An unapproved machine waits.
	_, body = get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:00:00:01&uuid=&serial=")
	if !strings.Contains(string(body), "waiting for approval") || strings.Contains(string(body), "kernel ") {
		t.Errorf("hold script:\n%s", body)
	}
	// Bad identities are refused.
	for _, q := range []string{"mac=zz", "mac=52:54:00:12:34:56&mac=52:54:00:12:34:57", "mac=52:54:00:12:34:56&uuid=nope", "mac=52:54:00:12:34:56&serial=%00"} {
		if resp, _ := get(t, f.srv.URL+"/boot.ipxe?"+q); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d; want 400", q, resp.StatusCode)
		}
	}
}

func TestImagesRangeAndETag(t *testing.T) {
	f := newFixture(t)
	url := f.srv.URL + "/images/" + f.image + "/vmlinuz"
	resp, body := get(t, url)
	if resp.StatusCode != 200 || !bytes.Equal(body, f.kernel) {
		t.Fatalf("GET: %d, %d bytes", resp.StatusCode, len(body))
	}
	etag := resp.Header.Get("ETag")
	if !strings.HasPrefix(etag, `"sha256:`) || resp.Header.Get("Accept-Ranges") != "bytes" {
		t.Errorf("ETag %q Accept-Ranges %q", etag, resp.Header.Get("Accept-Ranges"))
	}
	resp, body = get(t, url, "Range", "bytes=1000-1999")
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, f.kernel[1000:2000]) {
		t.Errorf("Range: %d, %d bytes, Content-Range %q", resp.StatusCode, len(body), resp.Header.Get("Content-Range"))
	}
	resp, _ = get(t, url, "If-None-Match", etag)
	if resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match: %d; want 304", resp.StatusCode)
	}
	resp, body = get(t, url, "Range", "bytes=99990-", "If-Range", etag)
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, f.kernel[99990:]) {
		t.Errorf("resume: %d, %d bytes", resp.StatusCode, len(body))
	}
	for _, bad := range []string{"/images/" + f.image + "/nothere", "/images/" + f.image + "/..%2fx", "/images/NOTANID/vmlinuz", "/images/" + strings.Repeat("0", 40) + "/vmlinuz"} {
		if resp, _ := get(t, f.srv.URL+bad); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d; want 404", bad, resp.StatusCode)
		}
	}
}

func TestUnverifiedImageNotServed(t *testing.T) {
	f := newFixture(t)
	// An image signed by a key gpuboot does not trust.
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	bad, err := imagetest.Write(f.store, otherPriv, map[string][]byte{"vmlinuz": []byte("untrusted kernel")})
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := get(t, f.srv.URL+"/images/"+bad+"/vmlinuz"); resp.StatusCode != http.StatusForbidden || bytes.Contains(body, []byte("untrusted kernel")) {
		t.Errorf("untrusted signature: %d %q; want 403", resp.StatusCode, body)
	}
	f.booter.image = bad
	_, body := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:12:34:56")
	if strings.Contains(string(body), "kernel ") || !strings.Contains(string(body), "cannot be booted") {
		t.Errorf("boot.ipxe for an unverified image:\n%s", body)
	}
	// A file replaced after verification is noticed and refused.
	if resp, _ := get(t, f.srv.URL+"/images/"+f.image+"/vmlinuz"); resp.StatusCode != 200 {
		t.Fatalf("good image: %d", resp.StatusCode)
	}
	p := filepath.Join(f.store, f.image, "vmlinuz")
	tampered := bytes.Clone(f.kernel)
	tampered[0] ^= 0xff
	tampered = append(tampered, 'x')
	if err := os.WriteFile(p, tampered, 0o644); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Minute)
	os.Chtimes(p, future, future)
	if resp, _ := get(t, f.srv.URL+"/images/"+f.image+"/vmlinuz"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("tampered file: %d; want 403", resp.StatusCode)
	}
	if resp, _ := get(t, f.srv.URL+"/images/"+f.image+"/initrd.img"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("other file of a tampered image: %d; want 403", resp.StatusCode)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t)
	get(t, f.srv.URL+"/images/"+f.image+"/vmlinuz")
	_, body := get(t, f.srv.URL+"/metrics")
	if want := fmt.Sprintf("gpuboot_http_bytes_total{route=\"images\"} %d", len(f.kernel)); !strings.Contains(string(body), want) {
		t.Errorf("metrics lack %q:\n%s", want, body)
	}
}

// FuzzBootQuery: any query gives 200 with an iPXE script or 400, never a
// panic, and a script never contains a line the server did not write.
func FuzzBootQuery(f *testing.F) {
	for _, q := range []string{"", "mac=52:54:00:12:34:56", "mac=52-54-00-12-34-56&uuid=4c4c4544-0042-3510-8052-b4c04f565331&serial=SN%201",
		"mac=52:54:00:12:34:56&serial=%0Ashell", "mac=%zz", "mac=a&mac=b", "uuid=x"} {
		f.Add(q)
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	store := f.TempDir()
	image, err := imagetest.Write(store, priv, nil)
	if err != nil {
		f.Fatal(err)
	}
	booter := BooterFunc(func(_ context.Context, id identity.Identity, _ netip.Addr) (Target, error) {
		if id.HardwareAddr()[5]&1 == 0 {
			return Target{Action: Boot, ImageID: image}, nil
		}
		return Target{Action: Hold}, nil
	})
	h, err := NewHandler(Config{ImageStore: store, TrustedKeys: []ed25519.PublicKey{pub}, BaseURL: "http://10.0.0.1:8080"}, booter)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, q string) {
		req := httptest.NewRequest("GET", "/boot.ipxe", nil)
		req.URL.RawQuery = q
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case 200:
			body := rec.Body.String()
			if !strings.HasPrefix(body, "#!ipxe\n") {
				t.Fatalf("200 without a script: %q", body)
			}
			for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
				switch strings.SplitN(line, " ", 2)[0] {
				case "#!ipxe", "chain", "echo", "sleep", "kernel", "initrd", "boot", ":failed":
				default:
					t.Fatalf("unexpected script line %q for query %q", line, q)
				}
			}
		case 400:
		default:
			t.Fatalf("status %d for %q", rec.Code, q)
		}
	})
}

// TestIPXEFiles: the iPXE binaries for UEFI HTTP boot are served by name
// from the configured directory, and nothing else is.
func TestIPXEFiles(t *testing.T) {
	f := newFixture(t)
	dir := f.handler.cfg.IPXEDir
	efi := []byte("MZ fake ipxe.efi")
	if err := os.WriteFile(filepath.Join(dir, "ipxe.efi"), efi, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := f.handler.cfg
	if _, err := NewHandler(cfg, f.booter); err == nil {
		t.Error("a second handler on the same registry: want an error")
	}
	cfg.Registry = nil
	h, err := NewHandler(cfg, f.booter)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, body := get(t, srv.URL+"/ipxe/ipxe.efi")
	if resp.StatusCode != 200 || !bytes.Equal(body, efi) {
		t.Errorf("ipxe.efi: %d %q", resp.StatusCode, body)
	}
	for _, bad := range []string{"/ipxe/..%2fetc%2fpasswd", "/ipxe/snponly.efi", "/ipxe/"} {
		if resp, _ := get(t, srv.URL+bad); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d; want 404", bad, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest("HEAD", srv.URL+"/images/"+f.image+"/vmlinuz", nil)
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if hr.StatusCode != 200 || hr.ContentLength != int64(len(f.kernel)) {
		t.Errorf("HEAD: %d, length %d", hr.StatusCode, hr.ContentLength)
	}
}

// TestImageFileLogged: every image file served leaves one Info line naming the image,
// the file, the client and the bytes sent, which is how an operator (and the power-on
// test, test/qemu) sees a machine fetch its kernel, initrd and rootfs.
func TestImageFileLogged(t *testing.T) {
	f := newFixture(t)
	var logged syncLog
	cfg := f.handler.cfg
	cfg.Registry = nil
	cfg.Log = slog.New(slog.NewTextHandler(&logged, nil))
	h, err := NewHandler(cfg, f.booter)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	url := srv.URL + "/images/" + f.image + "/vmlinuz"
	if resp, body := get(t, url); resp.StatusCode != 200 || len(body) != len(f.kernel) {
		t.Fatalf("GET vmlinuz: %d, %d bytes", resp.StatusCode, len(body))
	}
	if resp, _ := get(t, url, "Range", "bytes=0-99"); resp.StatusCode != http.StatusPartialContent {
		t.Fatalf("Range: %d", resp.StatusCode)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one log line per request, got %d:\n%s", len(lines), logged.String())
	}
	for i, want := range []string{
		fmt.Sprintf(`level=INFO msg="images: sent" image=%s file=vmlinuz to=127.0.0.1 bytes=%d range=false took=`, f.image, len(f.kernel)),
		fmt.Sprintf(`level=INFO msg="images: sent" image=%s file=vmlinuz to=127.0.0.1 bytes=100 range=true took=`, f.image),
	} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("log line %d:\n%s\nlacks %s", i, lines[i], want)
		}
	}
}

// syncLog is a log sink safe for the server's goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
