package train

import (
	"encoding/gob"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ortrain/ortrain/internal/grpo"
)

// ckptRound holds the generation round later steps still train on, so a
// resumed run trains on the very samples the interrupted one would have
// (regenerating them with newer weights would give other samples).
const ckptRound = "round.gob"

// writeRound saves round into the checkpoint directory dir (nothing when nil).
func writeRound(dir string, round []grpo.MicroBatch) error {
	if round == nil {
		return nil
	}
	f, err := os.Create(filepath.Join(dir, ckptRound))
	if err != nil {
		return fmt.Errorf("save round: %w", err)
	}
	if err := gob.NewEncoder(f).Encode(round); err != nil {
		f.Close()
		return fmt.Errorf("save round: %w", err)
	}
	return f.Close()
}

// readRound loads the round a checkpoint saved (nil when it saved none).
func readRound(dir string) ([]grpo.MicroBatch, error) {
	f, err := os.Open(filepath.Join(dir, ckptRound))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var round []grpo.MicroBatch
	if err := gob.NewDecoder(f).Decode(&round); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, ckptRound), err)
	}
	return round, nil
}

// ckptAhead holds the rounds an async run generated for later steps (see
// loop_async.go): a resumed run trains on them instead of generating them
// again with other weights.
const ckptAhead = "ahead.gob"

// writeAhead saves rounds into the checkpoint directory dir (nothing when none).
func writeAhead(dir string, rounds []*genRound) error {
	if len(rounds) == 0 {
		return nil
	}
	f, err := os.Create(filepath.Join(dir, ckptAhead))
	if err != nil {
		return fmt.Errorf("save rounds generated ahead: %w", err)
	}
	if err := gob.NewEncoder(f).Encode(rounds); err != nil {
		f.Close()
		return fmt.Errorf("save rounds generated ahead: %w", err)
	}
	return f.Close()
}

// readAhead loads the rounds a checkpoint generated ahead (nil when none).
func readAhead(dir string) ([]*genRound, error) {
	f, err := os.Open(filepath.Join(dir, ckptAhead))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rounds []*genRound
	if err := gob.NewDecoder(f).Decode(&rounds); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, ckptAhead), err)
	}
	return rounds, nil
}
