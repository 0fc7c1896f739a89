package openenvserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"

	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

// counter is a Gym-style env: add n to a total, done at 10.
type counter struct {
	total, steps int
}

func (c *counter) Reset(context.Context, map[string]json.RawMessage) (openenvserver.Observation, error) {
	*c = counter{}
	return openenvserver.Observation{Fields: map[string]int{"total": 0}, Reward: openenvserver.Reward(0)}, nil
}

func (c *counter) Step(_ context.Context, action json.RawMessage) (openenvserver.Observation, error) {
	var a struct{ N int }
	if err := json.Unmarshal(action, &a); err != nil {
		return openenvserver.Observation{}, err
	}
	c.total += a.N
	c.steps++
	done := c.total >= 10
	reward := 0.0
	if c.total == 10 {
		reward = 1
	}
	return openenvserver.Observation{Fields: map[string]int{"total": c.total}, Reward: &reward, Done: done}, nil
}

func (c *counter) State(context.Context) (json.RawMessage, error) {
	return json.Marshal(map[string]any{"episode_id": nil, "step_count": c.steps, "total": c.total})
}

func Example() {
	env := &openenvserver.Env{
		Name:               "CounterEnvironment",
		ActionName:         "AddAction",
		Action:             []openenvserver.Field{{Name: "n", Type: openenvserver.Integer, Required: true, Minimum: openenvserver.Bound(1), Maximum: openenvserver.Bound(5)}},
		ConcurrentSessions: true,
		New:                func(context.Context) (openenvserver.Instance, error) { return &counter{}, nil },
	}
	srv, err := openenvserver.New(openenvserver.Options{}, env)
	if err != nil {
		panic(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(l) }()
	ctx := context.Background()
	defer srv.Shutdown(ctx)

	c, _ := openenv.NewClient("http://"+l.Addr().String(), openenv.Options{})
	s, _, err := c.Start(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	_, err = s.Step(ctx, map[string]int{"n": 9})
	fmt.Println(err)
	for _, n := range []int{5, 5} {
		r, err := s.Step(ctx, map[string]int{"n": n})
		if err != nil {
			panic(err)
		}
		fmt.Println(string(r.Observation), *r.Reward, r.Done)
	}
	// Output:
	// openenv server error: Invalid message (code: VALIDATION_ERROR); n: Input should be less than or equal to 5
	// {"total":5} 0 false
	// {"total":10} 1 true
}
