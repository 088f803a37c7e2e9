package gpucompute

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// SGEMMTolerance bounds |gpu − cpu| / Σ|a·b| for a sampled entry of C. FP32
// accumulation over K terms errs by at most about K·2⁻²⁴ of Σ|a·b| (6·10⁻⁵ relative
// for K = 1024, 2.4·10⁻⁴ for 4096; typically √K·2⁻²⁴, far less); a wrong index or a
// lost tile errs by the order of Σ|a·b| itself.
const SGEMMTolerance = 1e-3

// FillMatrix fills m with values in [-1, 1) from a fixed seed, so a run is repeatable.
func FillMatrix(m []float32, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range m {
		m[i] = float32(r.Float64()*2 - 1)
	}
}

// Position is a sampled position of C.
type Position struct{ Row, Col int }

// SampleEntries picks count positions of an n×n matrix, the four corners first (the
// edges of the tiling) and then pseudo-random ones from a fixed seed.
func SampleEntries(n, count int) []Position {
	out := []Position{{0, 0}, {0, n - 1}, {n - 1, 0}, {n - 1, n - 1}}
	r := rand.New(rand.NewPCG(uint64(n), 42))
	for len(out) < count {
		out = append(out, Position{r.IntN(n), r.IntN(n)})
	}
	return out[:min(count, len(out))]
}

// ReferenceEntry computes C[row][col] of A·B (n×n, row-major) in float64 and the
// scale Σ|a·b| the tolerance is relative to.
func ReferenceEntry(a, b []float32, n, row, col int) (value, scale float64) {
	for k := 0; k < n; k++ {
		p := float64(a[row*n+k]) * float64(b[k*n+col])
		value += p
		scale += math.Abs(p)
	}
	return value, scale
}

// Verify compares the sampled entries of c against the CPU reference and returns the
// largest relative error and an error naming the worst entry when it exceeds
// SGEMMTolerance.
func Verify(a, b, c []float32, n int, entries []Position) (maxErr float64, err error) {
	if len(a) < n*n || len(b) < n*n || len(c) < n*n {
		return 0, fmt.Errorf("verify SGEMM: matrices smaller than %d×%d", n, n)
	}
	var worst Position
	var worstGot, worstWant float64
	for _, e := range entries {
		want, scale := ReferenceEntry(a, b, n, e.Row, e.Col)
		got := float64(c[e.Row*n+e.Col])
		rel := math.Abs(got-want) / math.Max(scale, math.SmallestNonzeroFloat32)
		if math.IsNaN(rel) || rel > maxErr || math.IsNaN(got) {
			if math.IsNaN(got) {
				rel = math.Inf(1)
			}
			maxErr, worst, worstGot, worstWant = rel, e, got, want
		}
	}
	if maxErr > SGEMMTolerance {
		return maxErr, fmt.Errorf("SGEMM result wrong: C[%d][%d] = %g, the CPU computes %g (relative error %.3g > %g)",
			worst.Row, worst.Col, worstGot, worstWant, maxErr, SGEMMTolerance)
	}
	return maxErr, nil
}

// CPUSGEMM is the whole product C = A·B in float32 with float64 accumulation, for
// tests of small matrices.
func CPUSGEMM(a, b []float32, n int) []float32 {
	c := make([]float32, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			v, _ := ReferenceEntry(a, b, n, i, j)
			c[i*n+j] = float32(v)
		}
	}
	return c
}
