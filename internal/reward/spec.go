package reward

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
)

// Kind says where a reward function's value comes from.
type Kind string

const (
	// KindEnv aggregates the environment's own rewards (last|sum|max|mean).
	KindEnv Kind = "env"
	// KindExpression evaluates a CEL expression over the trajectory.
	KindExpression Kind = "expression"
	// KindBuiltin runs one of the named functions in builtins.
	KindBuiltin Kind = "builtin"
	// KindHTTP POSTs the batch to a remote scorer.
	KindHTTP Kind = "http"
	// KindAgent is the reward a user's agent reported for its rollout
	// (agent: rollouts; 0 when it reported none).
	KindAgent Kind = "agent"
)

// Defaults for fields a spec leaves out.
const (
	DefaultWeight      = 1.0
	DefaultHTTPTimeout = 30 * time.Second
	DefaultHTTPRetries = 2
)

// Spec is one entry of the config's rewards: list. It is independent of
// the config package: the config decodes YAML into it and calls Validate.
// Fields that do not belong to the spec's kind must be left empty.
type Spec struct {
	// Name labels the function in metrics (rewards/<name>/mean) and in
	// errors; unique within a list, letters, digits, '_', '-', '.'.
	Name string `mapstructure:"name" yaml:"name" json:"name"`
	Kind Kind   `mapstructure:"kind" yaml:"kind" json:"kind"`
	// Weight is TRL's reward_weights entry; nil means 1.
	Weight *float64 `mapstructure:"weight" yaml:"weight,omitempty" json:"weight,omitempty"`

	// Aggregation (env, expression, http): how the env's per-call rewards
	// become env_reward: last, sum, max or mean. Empty means the caller's
	// default (Options.Aggregation).
	Aggregation string `mapstructure:"aggregation" yaml:"aggregation,omitempty" json:"aggregation,omitempty"`
	// Expression (expression): CEL over the variables of Variables().
	Expression string `mapstructure:"expression" yaml:"expression,omitempty" json:"expression,omitempty"`
	// Function (builtin): overlong_penalty, tool_call_format or length_penalty.
	Function string `mapstructure:"function" yaml:"function,omitempty" json:"function,omitempty"`
	// MaxLength and Cache (builtin overlong_penalty, length_penalty): in
	// completion tokens, the same count as the run's max completion tokens.
	MaxLength int `mapstructure:"max_length" yaml:"max_length,omitempty" json:"max_length,omitempty"`
	Cache     int `mapstructure:"cache" yaml:"cache,omitempty" json:"cache,omitempty"`
	// URL, Timeout and Retries (http): Timeout bounds each request (0 means
	// DefaultHTTPTimeout); Retries is the number of extra attempts after
	// a 5xx, a connection error or a timeout (nil means DefaultHTTPRetries).
	URL     string        `mapstructure:"url" yaml:"url,omitempty" json:"url,omitempty"`
	Timeout time.Duration `mapstructure:"timeout" yaml:"timeout,omitempty" json:"timeout,omitempty"`
	Retries *int          `mapstructure:"retries" yaml:"retries,omitempty" json:"retries,omitempty"`
}

// DefaultSpecs is the list used when a config names no rewards: the env's
// rewards alone, with the caller's aggregation, so existing configs keep
// their meaning.
func DefaultSpecs() []Spec { return []Spec{{Name: "env", Kind: KindEnv}} }

var validName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// FieldError is a spec error that names the offending field.
type FieldError struct {
	Reward string // the spec's name ("" when the name itself is wrong)
	Index  int    // position in the list
	Field  string // the YAML key
	Msg    string
}

func (e *FieldError) Error() string {
	who := fmt.Sprintf("rewards[%d]", e.Index)
	if e.Reward != "" {
		who += fmt.Sprintf(" (%s)", e.Reward)
	}
	return fmt.Sprintf("%s.%s: %s", who, e.Field, e.Msg)
}

// WeightValue is the spec's weight with the default applied.
func (s Spec) WeightValue() float64 {
	if s.Weight == nil {
		return DefaultWeight
	}
	return *s.Weight
}

// TimeoutValue is the http request deadline with the default applied.
func (s Spec) TimeoutValue() time.Duration {
	if s.Timeout == 0 {
		return DefaultHTTPTimeout
	}
	return s.Timeout
}

// RetriesValue is the number of http retries with the default applied.
func (s Spec) RetriesValue() int {
	if s.Retries == nil {
		return DefaultHTTPRetries
	}
	return *s.Retries
}

// Validate checks one spec on its own (index is its list position, for
// messages). Expressions are only compiled by Compile.
func (s Spec) Validate(index int) error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Reward: s.Name, Index: index, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if !validName.MatchString(s.Name) {
		return &FieldError{Index: index, Field: "name", Msg: fmt.Sprintf("%q: want letters, digits, '_', '-' or '.' (it names metrics rewards/<name>/mean)", s.Name)}
	}
	if w := s.WeightValue(); w != w {
		return bad("weight", "is NaN")
	}
	if s.Aggregation != "" {
		if s.Kind == KindBuiltin || s.Kind == KindAgent {
			return bad("aggregation", "only env, expression and http rewards aggregate env rewards, not %s", s.Kind)
		}
		if _, err := grpo.ParseRewardAggregation(s.Aggregation); err != nil {
			return bad("aggregation", "%q: allowed: last, sum, max, mean", s.Aggregation)
		}
	}
	unused := map[string]bool{
		"expression": s.Expression != "", "function": s.Function != "", "max_length": s.MaxLength != 0,
		"cache": s.Cache != 0, "url": s.URL != "", "timeout": s.Timeout != 0, "retries": s.Retries != nil,
	}
	switch s.Kind {
	case KindEnv, KindAgent:
	case KindExpression:
		if strings.TrimSpace(s.Expression) == "" {
			return bad("expression", "required for kind expression")
		}
		unused["expression"] = false
	case KindBuiltin:
		if err := s.validateBuiltin(bad); err != nil {
			return err
		}
		unused["function"], unused["max_length"], unused["cache"] = false, false, false
	case KindHTTP:
		u, err := url.Parse(s.URL)
		if s.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("url", "%q: want an http:// or https:// URL", s.URL)
		}
		if s.Timeout < 0 {
			return bad("timeout", "%s: must be positive", s.Timeout)
		}
		if s.RetriesValue() < 0 {
			return bad("retries", "%d: must be 0 or more", s.RetriesValue())
		}
		unused["url"], unused["timeout"], unused["retries"] = false, false, false
	default:
		return bad("kind", "%q: allowed: env, expression, builtin, http, agent", s.Kind)
	}
	for _, f := range []string{"expression", "function", "max_length", "cache", "url", "timeout", "retries"} {
		if unused[f] {
			return bad(f, "not used by kind %s", s.Kind)
		}
	}
	return nil
}

func (s Spec) validateBuiltin(bad func(field, format string, args ...any) error) error {
	b, ok := builtins[s.Function]
	if !ok {
		return bad("function", "%q: allowed: %s", s.Function, strings.Join(builtinNames(), ", "))
	}
	if !b.usesLength {
		if s.MaxLength != 0 || s.Cache != 0 {
			return bad("max_length", "%s takes no max_length or cache", s.Function)
		}
		return nil
	}
	if s.MaxLength <= 0 {
		return bad("max_length", "%d: %s needs a positive max_length (completion tokens)", s.MaxLength, s.Function)
	}
	if !b.usesCache {
		if s.Cache != 0 {
			return bad("cache", "%s takes no cache", s.Function)
		}
		return nil
	}
	if s.Cache <= 0 || s.Cache > s.MaxLength {
		return bad("cache", "%d: %s needs 0 < cache <= max_length (%d)", s.Cache, s.Function, s.MaxLength)
	}
	return nil
}

// ValidateSpecs checks every spec and that names are unique.
func ValidateSpecs(specs []Spec) error {
	seen := map[string]int{}
	var errs []error
	for i, s := range specs {
		if err := s.Validate(i); err != nil {
			errs = append(errs, err)
			continue
		}
		if j, dup := seen[s.Name]; dup {
			errs = append(errs, &FieldError{Reward: s.Name, Index: i, Field: "name", Msg: fmt.Sprintf("%q is also the name of rewards[%d]; names must be unique", s.Name, j)})
			continue
		}
		seen[s.Name] = i
	}
	return errors.Join(errs...)
}
