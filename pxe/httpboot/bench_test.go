package httpboot

import (
	"io"
	"net/http"
	"testing"
)

// BenchmarkServeImageFile: concurrent whole-file GETs of a 100 kB image
// file over loopback (verification cached after the first request).
func BenchmarkServeImageFile(b *testing.B) {
	f := newFixture(b)
	url := f.srv.URL + "/images/" + f.image + "/vmlinuz"
	b.SetBytes(int64(len(f.kernel)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := http.Get(url)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
