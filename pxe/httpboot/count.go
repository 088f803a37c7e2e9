package httpboot

import (
	"io"
	"net/http"
	"net/url"

	"github.com/prometheus/client_golang/prometheus"
)

// countingWriter counts body bytes. It implements io.ReaderFrom by
// delegating to the underlying writer, so that http.ServeContent of an
// *os.File still uses sendfile.
type countingWriter struct {
	http.ResponseWriter
	count prometheus.Counter
	sent  int64 // body bytes written through this writer
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.count.Add(float64(n))
	c.sent += int64(n)
	return n, err
}

func (c *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	var err error
	if rf, ok := c.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(r)
	} else {
		n, err = io.Copy(struct{ io.Writer }{c.ResponseWriter}, r)
	}
	c.count.Add(float64(n))
	c.sent += n
	return n, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func urlPathUnescape(s string) (string, error) { return url.PathUnescape(s) }
