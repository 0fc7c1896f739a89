package chat

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// mixedCorpus builds about size bytes of English prose, Go code and CJK
// text, shuffled deterministically so words vary.
func mixedCorpus(size int) string {
	english := strings.Fields(`The quick brown fox jumps over the lazy dog while the committee
		reviews quarterly results, discusses the budget's implications and schedules a follow-up
		meeting for Thursday at 3:45 PM; nobody expected 1,234 attendees or a 98.6% approval rate.`)
	code := []string{
		"func (s *Server) Handle(ctx context.Context, req *Request) (*Response, error) {\n",
		"\tif err := s.validate(req); err != nil {\n\t\treturn nil, fmt.Errorf(\"validate: %w\", err)\n\t}\n",
		"for i := 0; i < len(items); i++ {\n\tsum += items[i].Weight * 0.5\n}\n",
		"    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        return self.proj(F.gelu(x))\n",
		"SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id DESC LIMIT 10;\n",
	}
	cjk := []string{"机器学习模型的训练需要大量的数据和计算资源。", "今日は天気が良いので、公園で散歩しましょう。",
		"강화 학습은 보상을 최대화하는 정책을 배웁니다.", "这个函数返回一个错误，如果输入无效的话。"}
	rng := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	for b.Len() < size {
		switch rng.IntN(3) {
		case 0:
			for i := 0; i < 12; i++ {
				b.WriteString(english[rng.IntN(len(english))])
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d.\n", rng.IntN(100000))
		case 1:
			b.WriteString(code[rng.IntN(len(code))])
		default:
			b.WriteString(cjk[rng.IntN(len(cjk))])
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// BenchmarkEncodeQwenMixed reports encode throughput (MB/s) of the Qwen3
// tokenizer on a 1 MiB mixed corpus, with a warm merge cache (steady state
// of a training run) and with the cache emptied before every pass.
func BenchmarkEncodeQwenMixed(b *testing.B) {
	tok := loadFixture(b, "qwen3")
	corpus := mixedCorpus(1 << 20)
	b.Run("warm-cache", func(b *testing.B) {
		tok.Encode(corpus)
		b.SetBytes(int64(len(corpus)))
		b.ResetTimer()
		for b.Loop() {
			tok.Encode(corpus)
		}
	})
	b.Run("cold-cache", func(b *testing.B) {
		b.SetBytes(int64(len(corpus)))
		for b.Loop() {
			tok.model.cache.init()
			tok.Encode(corpus)
		}
	})
}

// BenchmarkRenderQwen3Conversation renders a 20-message tool conversation
// with the Qwen3 template.
func BenchmarkRenderQwen3Conversation(b *testing.B) {
	tok := loadFixture(b, "qwen3")
	tmpl, err := tok.Template("")
	if err != nil {
		b.Fatal(err)
	}
	msgs := []Message{{Role: "system", Content: "You are a helpful assistant."}, {Role: "user", Content: "Plan a trip to Paris and Tokyo."}}
	for len(msgs) < 20 {
		i := len(msgs)
		msgs = append(msgs,
			Message{Role: "assistant", ReasoningContent: "Need more data.", Content: fmt.Sprintf("Step %d.", i),
				ToolCalls: []ToolCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris", "days": 3}`)}}},
			Message{Role: "tool", Name: "get_weather", Content: `{"temp_c": 21, "sky": "clear", "wind_kph": 12}`})
	}
	if _, err := tmpl.Render(msgs, weatherTools, true, nil); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := tmpl.Render(msgs, weatherTools, true, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConversationToolTurn measures one AppendSampled +
// AppendToolResults on a Qwen2.5 conversation that already holds 10 tool
// turns (each tool turn re-renders and re-encodes the history to verify it).
func BenchmarkConversationToolTurn(b *testing.B) {
	tok := loadFixture(b, "qwen2.5")
	tmpl, err := tok.Template("")
	if err != nil {
		b.Fatal(err)
	}
	c, err := NewConversation(tok, tmpl, "Plan a trip.", ConversationOptions{System: "Be brief.", Tools: weatherTools})
	if err != nil {
		b.Fatal(err)
	}
	sampled := tok.Encode("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>")
	result := []ToolResult{{Name: "get_weather", Content: `{"temp_c": 21, "sky": "clear", "wind_kph": 12}`}}
	for range 10 {
		if _, err := c.AppendSampled(sampled); err != nil {
			b.Fatal(err)
		}
		if _, err := c.AppendToolResults(result); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		turn := *c
		turn.messages, turn.ids, turn.mask = c.Messages(), c.IDs(), append([]int8(nil), c.mask...)
		if _, err := turn.AppendSampled(sampled); err != nil {
			b.Fatal(err)
		}
		if _, err := turn.AppendToolResults(result); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(c.IDs())), "history-tokens")
}
