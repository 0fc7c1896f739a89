package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ortrain/ortrain/internal/config"
)

// flagError is the root's flag-error handler: a usage error, and for an
// unknown long flag a pointer to what the user most likely meant — the
// dashed spelling (--learning_rate is --learning-rate), the flag or config
// key of that name (--beta is grpo.beta), or what does a TRL setting's job
// (--use-vllm is engine.kind: vllm).
func flagError(cmd *cobra.Command, err error) error {
	var ne *pflag.NotExistError
	if errors.As(err, &ne) && ne.GetSpecifiedName() != "" {
		if hint := flagHint(cmd, ne.GetSpecifiedName()); hint != "" {
			err = fmt.Errorf("%w: %s", err, hint)
		}
	}
	return &UsageError{Err: err}
}

func flagHint(cmd *cobra.Command, name string) string {
	dashed := strings.ReplaceAll(name, "_", "-")
	if dashed != name && cmd.Flags().Lookup(dashed) != nil {
		return "ortrain's flags are spelled with dashes: --" + dashed
	}
	if cmd.Flags().Lookup("config") == nil {
		return "" // a command that reads no config: its flags are all there is
	}
	if trl, ok := config.TRLEquivalent(name); ok {
		return "a TRL setting; in ortrain: " + trl
	}
	key := config.KeyForLeaf(name)
	if key == "" {
		return ""
	}
	for _, f := range configFlags {
		if f.key == key && cmd.Flags().Lookup(f.name) != nil {
			return fmt.Sprintf("did you mean --%s (%s)?", f.name, key)
		}
	}
	if strings.Contains(key, "[]") {
		return fmt.Sprintf("it is the config key %s: set it in the --config YAML", key)
	}
	return fmt.Sprintf("it is the config key %s: --set %s=VALUE (or %s=VALUE, or the --config YAML)", key, key, config.EnvVarFor(key))
}
