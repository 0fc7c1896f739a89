package tfevents

import "strings"

// TrainerTags renames metrics the way Hugging Face Trainer's TensorBoard
// callback does (transformers' rewrite_logs), so a TRL user finds the same
// tags: eval_x becomes eval/x, test_x becomes test/x, anything else gets
// train/ (train/loss, train/reward, train/rewards/<fn>/mean). The step is
// the event's step, not a scalar, so a "step" key is dropped.
func TrainerTags(metrics map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(metrics))
	for k, v := range metrics {
		switch {
		case k == "step":
		case strings.HasPrefix(k, "eval_"):
			out["eval/"+strings.TrimPrefix(k, "eval_")] = v
		case strings.HasPrefix(k, "test_"):
			out["test/"+strings.TrimPrefix(k, "test_")] = v
		default:
			out["train/"+k] = v
		}
	}
	return out
}
