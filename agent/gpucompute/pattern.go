package gpucompute

import "fmt"

// FillPattern writes the copy test's pattern: word i is i·2654435761 + 1 (a
// multiplicative hash, so a word at a wrong offset shows).
func FillPattern(w []uint32) {
	for i := range w {
		w[i] = uint32(i)*2654435761 + 1
	}
}

// CheckPattern reports the first word that differs from FillPattern's.
func CheckPattern(w []uint32) error {
	for i := range w {
		if want := uint32(i)*2654435761 + 1; w[i] != want {
			return fmt.Errorf("word %d of the copy is %#x, want %#x", i, w[i], want)
		}
	}
	return nil
}
