package reward

import (
	"context"
	"testing"
)

// BenchmarkScoreLocal scores a batch of 64 with an env reward, two
// expressions and a builtin (no http): the per-step cost of local rewards.
func BenchmarkScoreLocal(b *testing.B) {
	set, err := Compile([]Spec{
		{Name: "env", Kind: KindEnv},
		{Name: "brevity", Kind: KindExpression, Expression: "completion_tokens < 8 ? 1.0 : 0.0"},
		{Name: "answer", Kind: KindExpression, Expression: "text.lowerAscii().contains(task.answer.lowerAscii()) ? 1.0 : 0.0"},
		{Name: "overlong", Kind: KindBuiltin, Function: "overlong_penalty", MaxLength: 512, Cache: 64},
	}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]Trajectory, 64)
	for i := range batch {
		batch[i] = sample()
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := set.Score(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
}
