package pbjson

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

func TestMarshalStableLayout(t *testing.T) {
	m, err := structpb.NewStruct(map[string]any{"healthyGpuCount": 7, "rack": "r1", "nested": map[string]any{"a": []any{1, "b"}}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	want := `{
  "healthyGpuCount": 7,
  "nested": {
    "a": [
      1,
      "b"
    ]
  },
  "rack": "r1"
}
`
	if string(got) != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if !json.Valid(got) || strings.Contains(string(got), ":  ") {
		t.Fatalf("not normalised: %q", got)
	}
}
