// Package ors is the Open Reward Standard client: target and catalog
// resolution, authentication, SSE, sessions, pings, retries and resume.
package ors
