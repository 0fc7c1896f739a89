// Package chat turns conversations into the exact token ids a Hugging Face
// model sees, and model output back into messages, for multi-turn RL.
//
// Tokenizer: LoadTokenizer reads a model directory (tokenizer.json, or
// vocab.json + merges.txt; tokenizer_config.json; generation_config.json;
// chat_template.jinja) and encodes like the `tokenizers` library with
// add_special_tokens=False: byte-level BPE with the GPT-2, Qwen2, Llama 3 and
// DeepSeek split patterns (the look-ahead `\s+(?!\S)` is implemented by hand,
// not approximated), SentencePiece-style BPE with byte fallback, added tokens
// matched longest-first before BPE. Decode honours the special flag;
// StreamDecoder never emits half a UTF-8 character.
//
// Template: a chat template rendered as transformers' apply_chat_template
// renders it (package jinja: trim_blocks, lstrip_blocks, loop controls,
// raise_exception, strftime_now, transformers' tojson).
//
// Tool calls: ParseToolCallsFor reads the calls of every major format
// (hermes, qwen_xml, llama3_json, mistral, deepseek_v3, glm45, minimax_m2,
// kimi_k2) and types text argument values by the offered tools' JSON
// Schemas; DetectToolCallFormat picks the format from the template (an
// unknown one is *UnknownToolCallFormatError). Every call is either a
// ToolCall or a *ToolCallError (Malformed or SchemaViolation), never
// dropped and never a panic.
//
// Conversation: the token-exact rollout transcript. Sampled ids are appended
// verbatim with loss mask 1; tool turns are rendered, checked against the
// held ids, and appended with mask 0. Templates that re-render history
// differently are detected (Divergence) and handled by the HistoryPolicy.
//
// Typical rollout use:
//
//	tok, _ := chat.LoadTokenizer(dir)
//	tmpl, _ := tok.Template("")
//	conv, _ := chat.NewConversation(tok, tmpl, task.Prompt, chat.ConversationOptions{Tools: tools})
//	ids := conv.IDs()
//	for {
//		sampled := generate(ids, tok.Special().EndOfTurn) // includes the end-of-turn id
//		msg, err := conv.AppendSampled(sampled)
//		if err != nil || len(msg.ToolCalls) == 0 {
//			break // ToolCallErrors: answer each with a tool turn, or end the rollout
//		}
//		results := runTools(msg.ToolCalls)
//		if ids, err = conv.AppendToolResults(results); err != nil {
//			break
//		}
//	}
//	train(conv.PromptIDs(), conv.CompletionIDs(), conv.LossMask())
package chat
