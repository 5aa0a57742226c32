//go:build race

package main

// raceEnabled is true when the tests run with the race detector; the
// binary under test is then built with it too.
const raceEnabled = true
