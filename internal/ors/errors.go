package ors

import "fmt"

// AuthError is a 401 from an ORS server or the platform: a missing or
// invalid API key. It is never retried.
type AuthError struct {
	URL    string
	Detail string
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("authentication failed at %s: %s", e.URL, e.Detail)
}
