package envtarget

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
)

// ReadTasksFile reads an OpenEnv tasks file: one JSON object per line with
// "prompt" (a string, or chat messages whose user contents are joined),
// "reset" (the reset kwargs) and an optional "split" (default train). The
// reset arguments of an ORS env imported into OpenEnv are checked: task_spec
// (an object), split (a string) and index (an integer >= 0), secrets (an
// object of strings, never shown).
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
		if err := checkResetArgs(row.Reset); err != nil {
			return nil, fmt.Errorf("tasks file %s line %d: reset: %w", path, line, err)
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

// checkResetArgs checks the reset arguments whose shape OpenEnv's ORS
// import fixes, so a typo fails when the file is read, not mid-run.
func checkResetArgs(reset map[string]any) error {
	if v, ok := reset["task_spec"]; ok {
		if _, obj := v.(map[string]any); !obj {
			return fmt.Errorf("task_spec must be an object (the task as the env lists it)")
		}
	}
	if v, ok := reset["split"]; ok {
		if _, str := v.(string); !str {
			return fmt.Errorf("split must be a string")
		}
	}
	if v, ok := reset["index"]; ok {
		f, num := v.(float64)
		if !num || f < 0 || f != math.Trunc(f) {
			return fmt.Errorf("index must be an integer >= 0")
		}
	}
	if v, ok := reset["secrets"]; ok {
		m, obj := v.(map[string]any)
		if !obj {
			return fmt.Errorf("secrets must be an object of strings")
		}
		for k, s := range m {
			if _, str := s.(string); !str {
				return fmt.Errorf("secrets.%s must be a string", k)
			}
		}
	}
	return nil
}
