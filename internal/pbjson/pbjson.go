// Package pbjson writes protobuf messages as indented JSON whose bytes are
// stable from run to run.
//
// protojson deliberately varies its whitespace between builds so that nobody
// depends on its exact output. Reports, API answers and CLI output are read
// by people and diffed by scripts, so gpurack normalises that whitespace:
// protojson decides the content, encoding/json.Indent the layout.
package pbjson

import (
	"bytes"
	"encoding/json"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Marshal returns m as protojson with two-space indentation and a trailing
// newline.
func Marshal(m proto.Message) ([]byte, error) {
	compact, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, compact, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
