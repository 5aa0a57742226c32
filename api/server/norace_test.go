//go:build !race

package server_test

// raceEnabled is true when the tests run with the race detector.
const raceEnabled = false
