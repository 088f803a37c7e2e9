package strictyaml

import (
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzDecode feeds arbitrary bytes to the decoder: it must never panic, every problem
// must name the file, what the walk accepts yaml.v3 must decode (an "internal decode
// error" is a walker bug), and an accepted value must survive a marshal round trip.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("name: &n r1\nteam: *n\n"))
	f.Add([]byte("labels:\n  a: x\n  a: y\n"))
	f.Add([]byte("{\"name\": \"r1\", \"hosts\": [{\"mac\": 1}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r rack
		_, err := Decode("f.yaml", data, &r)
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error is not a non-empty Errors: %#v", err)
			}
			for _, e := range es {
				if e.File != "f.yaml" || !strings.HasPrefix(e.Error(), "f.yaml") {
					t.Fatalf("problem without the file name: %v", e)
				}
				if strings.Contains(e.Msg, "internal decode error") {
					t.Fatalf("the walk accepted what yaml.v3 cannot decode: %v\n%q", e, data)
				}
			}
			return
		}
		out, err := yaml.Marshal(&r)
		if err != nil {
			t.Fatalf("marshal an accepted value: %v", err)
		}
		var again rack
		if _, err := Decode("again.yaml", out, &again); err != nil && !errors.Is(err, ErrEmpty) {
			t.Fatalf("an accepted value does not decode after a round trip: %v\n%s", err, out)
		}
		if err == nil {
			// Compared as YAML: a nil and an empty list are the same document.
			if out2, _ := yaml.Marshal(&again); string(out2) != string(out) {
				t.Fatalf("round trip changed the value:\n%s\n---\n%s", out, out2)
			}
		}
	})
}
