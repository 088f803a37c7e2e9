package xidclass

import "testing"

// TestWithdraws: the default withdraws exactly the codes whose class needs a GPU reset,
// a reboot or a replacement; an explicit list replaces it, codes outside it included.
func TestWithdraws(t *testing.T) {
	def := Withdraws(nil)
	for _, c := range Table() {
		if def(c.Code) != c.Class.Counts() {
			t.Errorf("XID %d (%s): default withdraws = %v, want %v", c.Code, c.Class, def(c.Code), c.Class.Counts())
		}
	}
	if def(999) {
		t.Error("an unknown XID withdraws a GPU by default; unknown codes are recoverable")
	}
	custom := Withdraws([]uint32{79, 92})
	for code, want := range map[uint32]bool{79: true, 92: true, 48: false, 13: false} {
		if custom(code) != want {
			t.Errorf("list [79 92]: XID %d withdraws = %v, want %v", code, custom(code), want)
		}
	}
	if !Known(48) || Known(999) {
		t.Error("Known disagrees with the table")
	}
}
