// Command ortrain trains LLM policies with GRPO against Open Reward Standard environments.
package main

import (
	"context"
	"os"

	"github.com/ortrain/ortrain/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:]))
}
