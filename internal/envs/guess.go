package envs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

// GuessEnvName is the guess env's OpenEnv name (/metadata).
const GuessEnvName = "GuessEnvironment"

const guessDefaultMax = 6

// guessObservation is the observation model (reward and done are lifted).
type guessObservation struct {
	Hint        string `json:"hint"`
	GuessesLeft int    `json:"guesses_left"`
	LastGuess   *int   `json:"last_guess"`
	Message     string `json:"message"`
}

// guessState is the full state: never the target.
type guessState struct {
	EpisodeID  *string `json:"episode_id"`
	StepCount  int     `json:"step_count"`
	MaxGuesses int     `json:"max_guesses"`
	Guesses    []int   `json:"guesses"`
	Solved     bool    `json:"solved"`
}

// guessGame is one session of the guess env.
type guessGame struct {
	started bool
	over    bool
	target  int
	state   guessState
}

// GuessTarget derives the secret number from a seed: any seed, the same
// number every time, spread over 1..100 (splitmix64).
func GuessTarget(seed int64) int {
	z := uint64(seed) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return int(z%100) + 1
}

func (g *guessGame) Reset(_ context.Context, kw map[string]json.RawMessage) (openenvserver.Observation, error) {
	maxGuesses := guessDefaultMax
	if raw, ok := kw["max_guesses"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &maxGuesses) != nil {
			return openenvserver.Observation{}, errors.New("max_guesses must be an integer")
		}
	}
	if maxGuesses < 1 {
		return openenvserver.Observation{}, fmt.Errorf("max_guesses must be at least 1, got %d", maxGuesses)
	}
	var target int
	if raw, ok := kw["target"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &target) != nil {
			return openenvserver.Observation{}, errors.New("target must be an integer")
		}
		if target < 1 || target > 100 {
			return openenvserver.Observation{}, fmt.Errorf("target must be between 1 and 100, got %d", target)
		}
	} else if raw, ok := kw["seed"]; ok && string(raw) != "null" {
		var seed int64
		if json.Unmarshal(raw, &seed) != nil {
			return openenvserver.Observation{}, errors.New("seed must be an integer")
		}
		target = GuessTarget(seed)
	} else {
		target = rand.IntN(100) + 1
	}
	episodeID, err := openenvserver.EpisodeID(kw)
	if err != nil {
		return openenvserver.Observation{}, err
	}
	*g = guessGame{started: true, target: target,
		state: guessState{EpisodeID: &episodeID, MaxGuesses: maxGuesses, Guesses: []int{}}}
	return openenvserver.Observation{
		Fields: guessObservation{Hint: "start", GuessesLeft: maxGuesses, Message: "Guess a number between 1 and 100."},
		Reward: openenvserver.Reward(0),
	}, nil
}

func (g *guessGame) Step(_ context.Context, action json.RawMessage) (openenvserver.Observation, error) {
	switch {
	case !g.started:
		return openenvserver.Observation{}, errors.New("call reset before step")
	case g.over:
		return openenvserver.Observation{}, errors.New("episode is over; call reset")
	}
	var a struct {
		Guess int `json:"guess"`
	}
	if err := json.Unmarshal(action, &a); err != nil {
		return openenvserver.Observation{}, fmt.Errorf("decode action: %w", err)
	}
	g.state.StepCount++
	g.state.Guesses = append(g.state.Guesses, a.Guess)
	obs := guessObservation{GuessesLeft: g.state.MaxGuesses - len(g.state.Guesses), LastGuess: &a.Guess}
	reward := 0.0
	switch {
	case a.Guess == g.target:
		obs.Hint, obs.Message, reward = "correct", "You got it!", 1
		g.state.Solved, g.over = true, true
	case a.Guess > g.target:
		obs.Hint, obs.Message = "lower", "Go lower."
	default:
		obs.Hint, obs.Message = "higher", "Go higher."
	}
	if !g.over && obs.GuessesLeft <= 0 {
		g.over = true
		obs.Message += fmt.Sprintf(" Out of guesses; the number was %d.", g.target)
	}
	return openenvserver.Observation{Fields: obs, Reward: openenvserver.Reward(reward), Done: g.over}, nil
}

func (g *guessGame) State(context.Context) (json.RawMessage, error) {
	st := g.state
	if st.Guesses == nil {
		st.Guesses = []int{}
	}
	return json.Marshal(st)
}

// Guess returns the number-guessing game: a Gym-style OpenEnv env whose
// action is {"guess": 1..100} and whose reward is 1.0 for the right guess.
func Guess() *openenvserver.Env {
	return &openenvserver.Env{
		Name:        GuessEnvName,
		Description: "number guessing (OpenEnv, Gym-style): action {\"guess\": 1..100}, hints lower/higher, reward 1.0 on the right guess",
		ActionName:  "GuessAction",
		Action: []openenvserver.Field{{Name: "guess", Type: openenvserver.Integer, Required: true,
			Description: "Your guess, between 1 and 100", Minimum: openenvserver.Bound(1), Maximum: openenvserver.Bound(100)}},
		ObservationSchema:  json.RawMessage(`{"properties":{"hint":{"title":"Hint","type":"string"},"guesses_left":{"title":"Guesses Left","type":"integer"},"last_guess":{"anyOf":[{"type":"integer"},{"type":"null"}],"default":null,"title":"Last Guess"},"message":{"title":"Message","type":"string"}},"required":["hint","guesses_left","message"],"title":"GuessObservation","type":"object"}`),
		StateSchema:        json.RawMessage(`{"properties":{"episode_id":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"Episode Id"},"step_count":{"default":0,"title":"Step Count","type":"integer"},"max_guesses":{"title":"Max Guesses","type":"integer"},"guesses":{"items":{"type":"integer"},"title":"Guesses","type":"array"},"solved":{"title":"Solved","type":"boolean"}},"title":"GuessState","type":"object"}`),
		ResetKwargs:        []string{"seed", "episode_id", "target", "max_guesses"},
		ConcurrentSessions: true,
		New: func(context.Context) (openenvserver.Instance, error) {
			return &guessGame{}, nil
		},
	}
}
