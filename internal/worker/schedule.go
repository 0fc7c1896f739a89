package worker

import (
	"fmt"
	"math"
)

// LRSchedule is the learning rate per optimizer step, as transformers'
// get_{constant,linear,cosine}_schedule_with_warmup: a linear warmup from 0
// over WarmupSteps, then constant, linear decay to 0 at TotalSteps, or a
// half cosine to 0 at TotalSteps.
type LRSchedule struct {
	Kind        string // "constant", "linear" or "cosine"
	Peak        float64
	WarmupSteps int
	TotalSteps  int
}

// Validate names the bad field.
func (s LRSchedule) Validate() error {
	switch {
	case s.Kind != "constant" && s.Kind != "linear" && s.Kind != "cosine":
		return fmt.Errorf("lr_scheduler_type: %q is unknown (allowed: constant, linear, cosine)", s.Kind)
	case !(s.Peak >= 0):
		return fmt.Errorf("learning_rate: %v must be >= 0", s.Peak)
	case s.WarmupSteps < 0:
		return fmt.Errorf("warmup_steps: %d must be >= 0", s.WarmupSteps)
	case s.Kind != "constant" && s.TotalSteps <= 0:
		return fmt.Errorf("max_steps: %d must be > 0 for a %s schedule", s.TotalSteps, s.Kind)
	}
	return nil
}

// At returns the learning rate of optimizer step `step` (0-based).
func (s LRSchedule) At(step int) float64 {
	if step < s.WarmupSteps {
		return s.Peak * float64(step) / float64(max(1, s.WarmupSteps))
	}
	progress := float64(step-s.WarmupSteps) / float64(max(1, s.TotalSteps-s.WarmupSteps))
	switch s.Kind {
	case "linear":
		return s.Peak * math.Max(0, 1-progress)
	case "cosine":
		return s.Peak * math.Max(0, 0.5*(1+math.Cos(math.Pi*progress)))
	}
	return s.Peak
}
