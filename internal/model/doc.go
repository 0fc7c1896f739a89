// Package model knows Hugging Face model directories in pure Go: it parses
// and validates config.json for the Llama / Mistral / Qwen2 / Qwen2.5 /
// Qwen3 family, reads and writes safetensors (single file or sharded
// index), fingerprints checkpoints (Hash), finds models in a directory or
// the local Hugging Face cache without downloading (Resolve), and creates
// randomly initialised models from presets (Init) with a byte-level
// tokenizer and a ChatML tool-calling chat template.
//
// Provenance: chat_template.jinja is the chat template of
// Qwen/Qwen2.5-7B-Instruct (tokenizer_config.json "chat_template"),
// byte-identical, Apache-2.0, (c) Alibaba Cloud Qwen team. The byte-to-
// unicode table and the pre-tokenizer regex follow GPT-2 (MIT, OpenAI) and
// Qwen2's tokenizer.json (Apache-2.0).
package model
