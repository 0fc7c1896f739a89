package gateway

import (
	"encoding/json"
	"net/http"
)

// A streamed response is written after sampling (the engine returns a
// completion whole), in the event order the openai clients' stream
// accumulator expects: response.created and response.in_progress (the
// response without output), then per output item output_item.added (the
// item empty, in progress), for a message content_part.added, one
// output_text.delta with the whole text, output_text.done and
// content_part.done, for a function call one function_call_arguments.delta
// and .done, then output_item.done (the item whole); last
// response.completed, or response.incomplete when the budget cut the
// completion, with the whole response. Each event is named by its type and
// numbered by sequence_number; there is no [DONE]. Every failure happens
// before the first byte, so errors keep their HTTP status.

// respEvent is any Responses stream event; which fields are set depends
// on Type. Indexes are pointers so that 0 is written.
type respEvent struct {
	Type           string          `json:"type"`
	SequenceNumber int             `json:"sequence_number"`
	Response       *responseOut    `json:"response,omitempty"`
	OutputIndex    *int            `json:"output_index,omitempty"`
	ItemID         string          `json:"item_id,omitempty"`
	ContentIndex   *int            `json:"content_index,omitempty"`
	Item           any             `json:"item,omitempty"`
	Part           *respTextPart   `json:"part,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Text           *string         `json:"text,omitempty"`
	Arguments      *string         `json:"arguments,omitempty"`
	Name           string          `json:"name,omitempty"`
	Logprobs       json.RawMessage `json:"logprobs,omitempty"`
}

func (g *Gateway) streamResponse(w http.ResponseWriter, resp *responseOut) {
	sse := newSSEWriter(w)
	seq := 0
	emit := func(ev respEvent) {
		ev.SequenceNumber = seq
		seq++
		sse.named(ev.Type, ev)
	}
	// The response before any output: what response.created announces.
	start := *resp
	start.Status, start.Output, start.Usage, start.CompletedAt, start.IncompleteDetails = "in_progress", []any{}, nil, nil, nil
	emit(respEvent{Type: "response.created", Response: &start})
	emit(respEvent{Type: "response.in_progress", Response: &start})
	zero := 0
	// The text events require logprobs; none are returned (include is
	// not applied).
	noLogprobs := json.RawMessage(`[]`)
	for i, item := range resp.Output {
		idx := i
		switch it := item.(type) {
		case respMessageOut:
			empty := it
			empty.Status, empty.Content = "in_progress", []respTextPart{}
			emit(respEvent{Type: "response.output_item.added", OutputIndex: &idx, Item: empty})
			part := it.Content[0]
			blank := respTextPart{Type: part.Type, Text: "", Annotations: []any{}}
			emit(respEvent{Type: "response.content_part.added", ItemID: it.ID, OutputIndex: &idx, ContentIndex: &zero, Part: &blank})
			if part.Text != "" {
				emit(respEvent{Type: "response.output_text.delta", ItemID: it.ID, OutputIndex: &idx, ContentIndex: &zero,
					Delta: &part.Text, Logprobs: noLogprobs})
			}
			emit(respEvent{Type: "response.output_text.done", ItemID: it.ID, OutputIndex: &idx, ContentIndex: &zero,
				Text: &part.Text, Logprobs: noLogprobs})
			emit(respEvent{Type: "response.content_part.done", ItemID: it.ID, OutputIndex: &idx, ContentIndex: &zero, Part: &part})
		case respFunctionCallOut:
			empty := it
			empty.Status, empty.Arguments = "in_progress", ""
			emit(respEvent{Type: "response.output_item.added", OutputIndex: &idx, Item: empty})
			emit(respEvent{Type: "response.function_call_arguments.delta", ItemID: it.ID, OutputIndex: &idx, Delta: &it.Arguments})
			emit(respEvent{Type: "response.function_call_arguments.done", ItemID: it.ID, OutputIndex: &idx,
				Arguments: &it.Arguments, Name: it.Name})
		}
		emit(respEvent{Type: "response.output_item.done", OutputIndex: &idx, Item: item})
	}
	final := "response.completed"
	if resp.Status == "incomplete" {
		final = "response.incomplete"
	}
	emit(respEvent{Type: final, Response: resp})
	if sse.err != nil {
		g.log.Debug().Err(sse.err).Str("id", resp.ID).Msg("stream ended early")
	}
}
