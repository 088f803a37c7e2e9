package profile

import "github.com/gpurack/gpurack/internal/strictyaml"

// Profiles and lock files are decoded by package strictyaml, which reports every
// unknown field, wrong type, duplicate key and alias by file, line and field before
// anything is decoded (docs/decisions/0002); validation then locates its own problems
// by the positions the decoder recorded.

// Error is one problem in a profile or lock file, located by file, line and field.
type Error = strictyaml.Error

// Errors is every problem found in one file, in line order.
type Errors = strictyaml.Errors
