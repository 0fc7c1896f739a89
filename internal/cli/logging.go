package cli

import (
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// newLogger builds the process logger: a human console writer when stderr is
// a terminal (or --log-format console), one JSON object per line otherwise.
func newLogger(io *IOStreams, level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Nop(), usageErrorf("--log-level %q is not a level (allowed: trace, debug, info, warn, error)", level)
	}
	var console bool
	switch strings.ToLower(format) {
	case "auto":
		console = io.IsStderrTTY()
	case "console":
		console = true
	case "json":
		console = false
	default:
		return zerolog.Nop(), usageErrorf("--log-format %q is not a format (allowed: console, json, auto)", format)
	}
	// Logs go through the status line so they print above a progress bar.
	out := io.statusLine()
	if console {
		w := zerolog.ConsoleWriter{Out: out, TimeFormat: time.TimeOnly, NoColor: !io.IsStderrTTY()}
		return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger(), nil
}
