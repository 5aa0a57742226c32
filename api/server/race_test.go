//go:build race

package server_test

// raceEnabled is true when the tests run with the race detector, which
// shuffles the Go scheduler's choices on purpose: the tests of what the
// scheduler's order gives do not check it then, and make test runs them
// without the race detector too (SCHEDULER_TESTS).
const raceEnabled = true
