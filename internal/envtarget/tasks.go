package envtarget

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// ReadTasksFile reads an OpenEnv tasks file: one JSON object per line with
// "prompt" (a string, or chat messages whose user contents are joined),
// "reset" (the reset kwargs) and an optional "split" (default train).
func ReadTasksFile(path string) ([]OpenEnvTask, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tasks file: %w", err)
	}
	var out []OpenEnvTask
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var row struct {
			Split  string          `json:"split"`
			Prompt json.RawMessage `json:"prompt"`
			Reset  map[string]any  `json:"reset"`
		}
		if err := json.Unmarshal(text, &row); err != nil {
			return nil, fmt.Errorf("tasks file %s line %d: %w", path, line, err)
		}
		prompt, err := promptText(row.Prompt)
		if err != nil {
			return nil, fmt.Errorf("tasks file %s line %d: prompt: %w", path, line, err)
		}
		out = append(out, OpenEnvTask{Split: row.Split, Prompt: prompt, Reset: row.Reset})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tasks file %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("tasks file %s has no tasks", path)
	}
	return out, nil
}

// promptText reads a prompt given as a string or as chat messages.
func promptText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var msgs []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return "", fmt.Errorf("want a string or a list of {role, content} messages")
	}
	var parts []string
	for _, m := range msgs {
		if m.Role == "user" {
			parts = append(parts, m.Content)
		}
	}
	return strings.Join(parts, "\n"), nil
}
