package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at link time: -ldflags "-X github.com/ortrain/ortrain/internal/cli.version=v0.1.0".
var version = "dev"

// Version returns the ortrain version and, when built from a git checkout,
// the commit.
func Version() string {
	v := version
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += "+" + s.Value[:12]
			}
		}
	}
	return v
}

func newVersionCmd(deps *Deps) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the ortrain version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprint(deps.IO.Out, versionLine())
			return nil
		},
	}
}

// versionLine is the one line `ortrain version` and `ortrain --version` print.
func versionLine() string {
	return fmt.Sprintf("ortrain %s (%s, %s/%s)\n", Version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
