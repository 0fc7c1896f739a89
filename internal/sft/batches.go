package sft

import (
	"context"
	"math/rand/v2"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/train"
)

// Batches is the batch source of an SFT run (train.BatchSource): rows are
// drawn from an endless sequence of epochs, each a permutation of the rows
// seeded by (seed, epoch), so the position (rows drawn) alone says where a
// run is and resume is exact. Each optimizer step takes P*B*GA rows: GA
// global micro-batches of P*B rows (each rank trains on B of them), all
// normalised by the step's trained-token count, so the step's loss is the
// mean over its trained tokens (TRL's num_items_in_batch).
type Batches struct {
	rows      []grpo.Row
	seed      uint64
	perStep   int // P*B*GA rows
	perMicro  int // P*B rows
	ga        int
	pos       int64 // rows drawn by completed steps
	permEpoch int64
	perm      []int

	step []grpo.MicroBatch // the step in progress
	next int
	// The step's token counts, for metrics.
	stepTokens, stepTrained int
}

// NewBatches draws micro-batches of b rows per rank over ranks ranks, ga
// per optimizer step.
func NewBatches(rows []grpo.Row, seed int64, b, ranks, ga int) *Batches {
	return &Batches{rows: rows, seed: uint64(seed), perStep: b * ranks * ga, perMicro: b * ranks, ga: ga, permEpoch: -1}
}

// StepsFor is the number of optimizer steps of epochs passes over the rows
// (at least 1).
func (s *Batches) StepsFor(epochs float64) int {
	n := int(epochs*float64(len(s.rows))) / s.perStep
	return max(1, n)
}

// Position is the rows drawn by completed steps; Restore returns to one.
func (s *Batches) Position() int64 { return s.pos }

// Restore sets the position (a resumed run, or a failed step rewound).
func (s *Batches) Restore(pos int64) {
	s.pos, s.step, s.next = pos, nil, 0
}

// Commit marks the step in progress as completed.
func (s *Batches) Commit() {
	s.pos += int64(s.perStep)
	s.step, s.next = nil, 0
}

// Epoch is how many passes over the rows the completed steps made.
func (s *Batches) Epoch() float64 { return float64(s.pos) / float64(len(s.rows)) }

// StepTokens are the step in progress's tokens and trained tokens.
func (s *Batches) StepTokens() (all, trained int) { return s.stepTokens, s.stepTrained }

// row is the i-th row of the endless sequence.
func (s *Batches) row(i int64) grpo.Row {
	n := int64(len(s.rows))
	if e := i / n; e != s.permEpoch {
		s.perm = rand.New(rand.NewPCG(s.seed, uint64(e))).Perm(len(s.rows))
		s.permEpoch = e
	}
	return s.rows[s.perm[i%n]]
}

// NextMicroBatch implements train.BatchSource.
func (s *Batches) NextMicroBatch(context.Context, *train.StepMetrics) (grpo.MicroBatch, error) {
	if s.step == nil {
		s.prepareStep()
	}
	mb := s.step[s.next%s.ga]
	s.next++
	return mb, nil
}

// prepareStep draws the rows of the step at the current position.
func (s *Batches) prepareStep() {
	rows := make([]grpo.Row, s.perStep)
	s.stepTokens, s.stepTrained = 0, 0
	for i := range rows {
		rows[i] = s.row(s.pos + int64(i))
		s.stepTokens += len(rows[i].Tokens)
		for _, m := range rows[i].LossMask {
			s.stepTrained += int(m)
		}
	}
	norm := float64(max(1, s.stepTrained))
	s.step = make([]grpo.MicroBatch, s.ga)
	for k := range s.step {
		s.step[k] = grpo.MicroBatch{Rows: rows[k*s.perMicro : (k+1)*s.perMicro], RoundTokens: norm, GradAccumSteps: s.ga}
	}
	s.next = 0
}
