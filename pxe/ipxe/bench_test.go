package ipxe

import "testing"

func BenchmarkRenderBoot(b *testing.B) {
	s := bootScript()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Render(s); err != nil {
			b.Fatal(err)
		}
	}
}
