// Package demos writes demonstrations for supervised fine-tuning: it plays
// an env through its real protocol (any envtarget.Env: a built-in served on
// loopback, a URL) with a scripted policy, and writes each episode as one
// JSONL line in TRL's conversational SFT format (messages with tool calls,
// tools, plus the reward and task id).
package demos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ortrain/ortrain/internal/envtarget"
)

// Defaults of Options.
const (
	DefaultSplit          = "train"
	DefaultConcurrency    = 8
	DefaultEpisodeTimeout = time.Minute
)

// closeTimeout bounds closing a session, also after ctx ended.
const closeTimeout = 10 * time.Second

// Options configure Write.
type Options struct {
	// Script names the scripted policy (see Scripts), e.g. "lockbox".
	Script string
	// N episodes are played, on the split's tasks in order, cycling when N
	// exceeds the task count.
	N     int
	Split string // default "train"
	// Skill in [0, 1] says how well the scripted policy plays: 1 always
	// right, 0 (the zero value) never.
	Skill float64
	// Seed fixes every random choice: the same options write the same bytes.
	Seed uint64
	// Concurrency bounds the episodes played at once (default 8); lines are
	// written in episode order whatever it is.
	Concurrency int
	// EpisodeTimeout bounds one episode, session opening and closing
	// included (default 1 minute).
	EpisodeTimeout time.Duration
	// Progress, when set, is called after each written episode.
	Progress func(done, total int)
}

// OptionError is an option out of its range.
type OptionError struct {
	Option string // the Options field: N, Skill, Split, Concurrency, EpisodeTimeout
	Reason string
}

func (e *OptionError) Error() string { return fmt.Sprintf("%s: %s", e.Option, e.Reason) }

// Summary describes what Write wrote.
type Summary struct {
	Episodes      int
	MeanReward    float64
	MeanToolCalls float64 // tool calls per episode
	// ToolCalls counts the calls of each tool over every episode.
	ToolCalls map[string]int
}

func (o *Options) normalize() error {
	if o.Split == "" {
		o.Split = DefaultSplit
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.EpisodeTimeout == 0 {
		o.EpisodeTimeout = DefaultEpisodeTimeout
	}
	switch {
	case o.N < 1:
		return &OptionError{Option: "N", Reason: fmt.Sprintf("%d episodes: want at least 1", o.N)}
	case math.IsNaN(o.Skill) || o.Skill < 0 || o.Skill > 1:
		return &OptionError{Option: "Skill", Reason: fmt.Sprintf("%g is outside [0, 1]", o.Skill)}
	case o.Concurrency < 1:
		return &OptionError{Option: "Concurrency", Reason: fmt.Sprintf("%d: want at least 1", o.Concurrency)}
	case o.EpisodeTimeout < 0:
		return &OptionError{Option: "EpisodeTimeout", Reason: fmt.Sprintf("%s: want a positive duration", o.EpisodeTimeout)}
	}
	return nil
}

// task is one task of the split: its index and id.
type task struct {
	index int
	id    string
}

// Write plays opts.N episodes of env with the scripted policy opts.Script
// and writes them to w as JSONL, in episode order. An option out of range
// is an *OptionError, an unknown script a *NoScriptError; an episode that
// fails (the env unreachable, a tool error) stops the run with its error.
func Write(ctx context.Context, env envtarget.Env, opts Options, w io.Writer) (Summary, error) {
	if err := opts.normalize(); err != nil {
		return Summary{}, err
	}
	script, err := ScriptFor(opts.Script)
	if err != nil {
		return Summary{}, err
	}
	tasks, err := listTasks(ctx, env, opts.Split, opts.N)
	if err != nil {
		return Summary{}, err
	}
	sum := Summary{ToolCalls: map[string]int{}}
	var rewards, calls float64
	// Play in chunks of a few rounds of workers: lines stay in order and
	// memory stays bounded however large N is.
	chunk := opts.Concurrency * 4
	for lo := 0; lo < opts.N; lo += chunk {
		hi := min(lo+chunk, opts.N)
		recs, err := playRange(ctx, env, script, tasks, opts, lo, hi)
		if err != nil {
			return sum, err
		}
		for _, r := range recs {
			line, err := marshalLine(&r)
			if err != nil {
				return sum, fmt.Errorf("encode episode %d: %w", sum.Episodes, err)
			}
			if _, err := w.Write(line); err != nil {
				return sum, fmt.Errorf("write episode %d: %w", sum.Episodes, err)
			}
			sum.Episodes++
			rewards += r.Reward
			for _, m := range r.Messages {
				for _, c := range m.ToolCalls {
					sum.ToolCalls[c.Function.Name]++
					calls++
				}
			}
			if opts.Progress != nil {
				opts.Progress(sum.Episodes, opts.N)
			}
		}
	}
	sum.MeanReward = rewards / float64(sum.Episodes)
	sum.MeanToolCalls = calls / float64(sum.Episodes)
	return sum, nil
}

// listTasks returns the first min(n, size) tasks of split with their ids:
// the spec's "id" when it has one, else SPLIT/INDEX.
func listTasks(ctx context.Context, env envtarget.Env, split string, n int) ([]task, error) {
	size, err := env.NumTasks(ctx, split)
	if err != nil {
		return nil, fmt.Errorf("count the tasks of split %q of %s: %w", split, env.Name(), err)
	}
	if size == 0 {
		return nil, &OptionError{Option: "Split", Reason: fmt.Sprintf("split %q of %s has no tasks", split, env.Name())}
	}
	l, err := env.Describe(ctx, envtarget.Query{Split: split, NumTasks: min(n, size)})
	if err != nil {
		return nil, fmt.Errorf("list the tasks of split %q of %s: %w", split, env.Name(), err)
	}
	if len(l.Tasks) == 0 {
		return nil, fmt.Errorf("%s listed no tasks of split %q", env.Name(), split)
	}
	out := make([]task, len(l.Tasks))
	for i, t := range l.Tasks {
		var spec struct {
			ID any `json:"id"`
		}
		_ = json.Unmarshal(t.Spec, &spec)
		id, ok := spec.ID.(string)
		if !ok || id == "" {
			id = fmt.Sprintf("%s/%d", split, t.Index)
		}
		out[i] = task{index: t.Index, id: id}
	}
	return out, nil
}

// playRange plays episodes lo..hi-1 with at most opts.Concurrency at once
// and returns their records in order; the first failure cancels the rest.
func playRange(ctx context.Context, env envtarget.Env, script Script, tasks []task, opts Options, lo, hi int) ([]Record, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recs := make([]Record, hi-lo)
	errs := make([]error, hi-lo)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(opts.Concurrency, hi-lo) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				rec, err := playOne(ctx, env, script, tasks[i%len(tasks)], opts, i)
				if err != nil {
					errs[i-lo] = err
					cancel()
					continue
				}
				recs[i-lo] = rec
			}
		}()
	}
feed:
	for i := lo; i < hi; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	// The first failure in episode order; a cancellation it caused in
	// later episodes is not the story.
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return recs, nil
}

// playOne opens a session on t, plays episode i with the script and
// returns its record.
func playOne(ctx context.Context, env envtarget.Env, script Script, t task, opts Options, i int) (rec Record, err error) {
	ctx, cancel := context.WithTimeout(ctx, opts.EpisodeTimeout)
	defer cancel()
	fail := func(err error) (Record, error) {
		return Record{}, fmt.Errorf("episode %d (task %s, %s index %d): %w", i, t.id, opts.Split, t.index, err)
	}
	sess, err := env.OpenSession(ctx, envtarget.TaskRef{Split: opts.Split, Index: t.index})
	if err != nil {
		return fail(fmt.Errorf("open session: %w", err))
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer ccancel()
		if cerr := sess.Close(cctx); cerr != nil && err == nil {
			rec, err = fail(fmt.Errorf("close session: %w", cerr))
		}
	}()
	prompt, err := sess.Prompt(ctx)
	if err != nil {
		return fail(fmt.Errorf("prompt: %w", err))
	}
	specs, err := sess.Tools(ctx)
	if err != nil {
		return fail(fmt.Errorf("tools: %w", err))
	}
	tools := make([]Tool, len(specs))
	for j, s := range specs {
		params, err := parameters(s.InputSchema)
		if err != nil {
			return fail(fmt.Errorf("tool %s: input schema: %w", s.Name, err))
		}
		tools[j] = Tool{Type: "function", Function: Function{Name: s.Name, Description: s.Description, Parameters: params}}
	}
	ep := &Episode{
		Prompt: prompt, Tools: specs, Skill: opts.Skill,
		Rand:     rand.New(rand.NewPCG(opts.Seed, uint64(i))),
		sess:     sess,
		messages: []Message{{Role: "user", Content: prompt}},
	}
	if err := script(ctx, ep); err != nil {
		return fail(err)
	}
	return Record{Messages: ep.messages, Tools: tools, Reward: ep.reward, TaskID: t.id}, nil
}
