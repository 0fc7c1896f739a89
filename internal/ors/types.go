package ors

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Block is one prompt or tool-output block: text, or a base64 image. Unknown
// block types read from a server are kept with only Type set.
type Block struct {
	Type     string          // "text" or "image"
	Text     string          // text blocks
	Data     string          // image blocks: base64 bytes
	MimeType string          // image blocks
	Detail   json.RawMessage // optional object; nil encodes as null
}

// TextBlock returns a text block.
func TextBlock(text string) Block { return Block{Type: "text", Text: text} }

// MarshalJSON writes every key the Python clients index (§5.1, §5.2).
func (b Block) MarshalJSON() ([]byte, error) {
	detail := rawOrNull(b.Detail)
	var buf bytes.Buffer
	switch b.Type {
	case "image":
		buf.WriteString(`{"data":`)
		writeString(&buf, b.Data)
		buf.WriteString(`,"mimeType":`)
		writeString(&buf, b.MimeType)
		buf.WriteString(`,"detail":`)
		buf.Write(detail)
		buf.WriteString(`,"type":"image"}`)
	case "text", "":
		buf.WriteString(`{"text":`)
		writeString(&buf, b.Text)
		buf.WriteString(`,"detail":`)
		buf.Write(detail)
		buf.WriteString(`,"type":"text"}`)
	default:
		return nil, fmt.Errorf("block type %q is not text or image", b.Type)
	}
	return buf.Bytes(), nil
}

// UnmarshalJSON reads a block of any type.
func (b *Block) UnmarshalJSON(data []byte) error {
	var w struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		Data     string          `json:"data"`
		MimeType string          `json:"mimeType"`
		Detail   json.RawMessage `json:"detail"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	if string(w.Detail) == "null" {
		w.Detail = nil
	}
	*b = Block{Type: w.Type, Text: w.Text, Data: w.Data, MimeType: w.MimeType, Detail: w.Detail}
	return nil
}

// ToolSpec describes one tool: exactly the three keys of §5.4. A nil
// InputSchema (JSON null) means the tool takes no arguments.
type ToolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// ToolOutput is what one tool call returns (§5.5).
type ToolOutput struct {
	Blocks   []Block
	Metadata json.RawMessage // JSON object or nil (null)
	Reward   *float64        // nil = no reward
	Finished bool
}

// Reward returns a pointer to r, for ToolOutput.Reward.
func Reward(r float64) *float64 { return &r }

// Text joins the output's text blocks with newlines.
func (o *ToolOutput) Text() string {
	var buf bytes.Buffer
	for _, b := range o.Blocks {
		if b.Type != "text" {
			continue
		}
		if buf.Len() > 0 {
			buf.WriteByte('\n')
		}
		buf.WriteString(b.Text)
	}
	return buf.String()
}

// MarshalJSON writes all four keys, rewards as Python floats (1.0) and
// non-finite rewards as null (§2.4).
func (o ToolOutput) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"blocks":`)
	if len(o.Blocks) == 0 {
		buf.WriteString("[]")
	} else {
		blocks, err := MarshalJSON(o.Blocks)
		if err != nil {
			return nil, err
		}
		buf.Write(blocks)
	}
	buf.WriteString(`,"metadata":`)
	buf.Write(rawOrNull(o.Metadata))
	buf.WriteString(`,"reward":`)
	if o.Reward == nil {
		buf.WriteString("null")
	} else {
		buf.WriteString(FormatFloat(*o.Reward))
	}
	buf.WriteString(`,"finished":`)
	buf.WriteString(strconv.FormatBool(o.Finished))
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// UnmarshalJSON reads a ToolOutput; a non-numeric reward reads as nil.
func (o *ToolOutput) UnmarshalJSON(data []byte) error {
	var w struct {
		Blocks   []Block         `json:"blocks"`
		Metadata json.RawMessage `json:"metadata"`
		Reward   *float64        `json:"reward"`
		Finished bool            `json:"finished"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	if string(w.Metadata) == "null" {
		w.Metadata = nil
	}
	var blocks []Block
	for _, b := range w.Blocks {
		if b.Type == "text" || b.Type == "image" {
			blocks = append(blocks, b) // unknown block types are dropped, as the Python clients do
		}
	}
	*o = ToolOutput{Blocks: blocks, Metadata: w.Metadata, Reward: w.Reward, Finished: w.Finished}
	return nil
}

// RunToolOutput is the /call result (§5.6).
type RunToolOutput struct {
	OK     bool        `json:"ok"`
	Output *ToolOutput `json:"output,omitempty"`
	Error  string      `json:"error,omitempty"`
	Reason string      `json:"reason,omitempty"`
}

// Split is one task split (§5.9).
type Split struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// Task is one task of a split; Spec keeps the server's bytes (and key order).
type Task struct {
	Index int
	Spec  json.RawMessage
	// EnvName is the env_name the server returned with the task.
	EnvName string
}

// FormatFloat writes f the way Python's json module does: integral values
// keep a ".0", non-finite values become null.
func FormatFloat(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "null"
	}
	abs := math.Abs(f)
	if abs != 0 && (abs < 1e-4 || abs >= 1e16) {
		s := strconv.FormatFloat(f, 'e', -1, 64)
		return s
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !bytes.ContainsAny([]byte(s), ".e") {
		s += ".0"
	}
	return s
}

// MarshalJSON encodes v compactly without HTML escaping (<, >, & stay raw,
// as pydantic writes them).
func MarshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func writeString(buf *bytes.Buffer, s string) {
	b, _ := MarshalJSON(s) // strings always encode
	buf.Write(b)
}

func rawOrNull(r json.RawMessage) []byte {
	if len(bytes.TrimSpace(r)) == 0 {
		return []byte("null")
	}
	return r
}
