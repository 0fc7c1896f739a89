// Package configs embeds the example configurations shipped with ortrain.
package configs

import (
	_ "embed"
	"slices"
)

//go:embed quickstart.yaml
var quickstart []byte

// Quickstart returns configs/quickstart.yaml: the main job on the embedded
// defaults (CPU, built-in letters env, tiny model).
func Quickstart() []byte { return slices.Clone(quickstart) }
