package ors_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// TestStatusMapping checks which typed error each answer becomes and how
// often it is tried.
func TestStatusMapping(t *testing.T) {
	tests := []struct {
		status   int
		body     string
		attempts int
		check    func(t *testing.T, err error)
	}{
		{403, `{"detail":"forbidden"}`, 1, func(t *testing.T, err error) { var e *ors.AuthError; require.ErrorAs(t, err, &e) }},
		{404, `{"detail":"Deployment not found."}`, 1, func(t *testing.T, err error) {
			var e *ors.NotFoundError
			require.ErrorAs(t, err, &e)
			assert.Equal(t, "deployment", e.What)
			assert.Contains(t, e.Detail, "case-sensitive")
		}},
		{404, `{"detail":"Not Found"}`, 1, func(t *testing.T, err error) {
			var e *ors.NotFoundError
			require.ErrorAs(t, err, &e)
			assert.Equal(t, "route", e.What)
		}},
		{410, `{"detail":"Session deleted"}`, 1, func(t *testing.T, err error) { var e *ors.SessionTerminatedError; require.ErrorAs(t, err, &e) }},
		{422, `{"detail":[{"type":"missing"}]}`, 1, func(t *testing.T, err error) {
			var e *ors.InvalidRequestError
			require.ErrorAs(t, err, &e)
			assert.Equal(t, `[{"type":"missing"}]`, e.Detail)
		}},
		{500, `{"detail":"RuntimeError: boom"}`, 1, func(t *testing.T, err error) {
			var e *ors.StatusError
			require.ErrorAs(t, err, &e)
			assert.Equal(t, "RuntimeError: boom", e.Detail)
		}},
		{429, `slow down`, 3, func(t *testing.T, err error) {
			var e *ors.StatusError
			require.ErrorAs(t, err, &e)
			assert.Equal(t, "slow down", e.Detail)
		}},
		{502, `<html>bad gateway</html>`, 3, func(t *testing.T, err error) { var e *ors.StatusError; require.ErrorAs(t, err, &e) }},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.status, " ", tt.body), func(t *testing.T) {
			k := startKit(t, orsserver.Options{}, func(w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
				return true
			})
			c := newClient(t, k.url, ors.Options{})
			_, err := c.NumTasks(ctx, "train")
			require.Error(t, err)
			tt.check(t, err)
			assert.Len(t, k.seen(), tt.attempts)
		})
	}
}
