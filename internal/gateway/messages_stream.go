package gateway

import (
	"encoding/json"
	"net/http"
)

// A streamed Messages reply is written after sampling (the engine returns
// a completion whole), in the event order Anthropic's SDKs accumulate:
// message_start (the message with no content), ping, then per block
// content_block_start, one delta (text_delta, or input_json_delta with the
// tool input's whole JSON) and content_block_stop, then message_delta (the
// stop reason and usage) and message_stop. Every failure happens before the
// first byte, so errors keep their HTTP status.

type anthBlockIndex struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
}

type anthBlockStart struct {
	Type         string       `json:"type"`
	Index        int          `json:"index"`
	ContentBlock anthBlockOut `json:"content_block"`
}

type anthBlockDelta struct {
	Type  string    `json:"type"`
	Index int       `json:"index"`
	Delta anthDelta `json:"delta"`
}

type anthDelta struct {
	Type        string  `json:"type"`
	Text        *string `json:"text,omitempty"`
	PartialJSON *string `json:"partial_json,omitempty"`
}

type anthMessageDelta struct {
	Type  string `json:"type"`
	Delta struct {
		StopReason   *string `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	} `json:"delta"`
	Usage messagesUsage `json:"usage"`
}

func (g *Gateway) streamMessage(w http.ResponseWriter, m anthMessageOut) {
	sse := newSSEWriter(w)
	start := m
	start.Content = []anthBlockOut{}
	start.StopReason, start.StopSequence = nil, nil
	start.Usage.OutputTokens = 0 // counted in message_delta, as Anthropic does
	sse.named("message_start", struct {
		Type    string         `json:"type"`
		Message anthMessageOut `json:"message"`
	}{"message_start", start})
	sse.named("ping", struct {
		Type string `json:"type"`
	}{"ping"})
	for i, b := range m.Content {
		head := b
		delta := anthDelta{}
		switch b.Type {
		case "tool_use":
			head.Input = json.RawMessage("{}")
			input := string(b.Input)
			delta = anthDelta{Type: "input_json_delta", PartialJSON: &input}
		default:
			head.Text = new(string)
			delta = anthDelta{Type: "text_delta", Text: b.Text}
		}
		sse.named("content_block_start", anthBlockStart{Type: "content_block_start", Index: i, ContentBlock: head})
		if (delta.Text != nil && *delta.Text != "") || delta.PartialJSON != nil {
			sse.named("content_block_delta", anthBlockDelta{Type: "content_block_delta", Index: i, Delta: delta})
		}
		sse.named("content_block_stop", anthBlockIndex{Type: "content_block_stop", Index: i})
	}
	md := anthMessageDelta{Type: "message_delta", Usage: m.Usage}
	md.Delta.StopReason, md.Delta.StopSequence = m.StopReason, m.StopSequence
	sse.named("message_delta", md)
	sse.named("message_stop", struct {
		Type string `json:"type"`
	}{"message_stop"})
	if sse.err != nil {
		g.log.Debug().Err(sse.err).Str("id", m.ID).Msg("messages stream ended early")
	}
}
