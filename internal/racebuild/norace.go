//go:build !race

// Package racebuild tells whether the build has the race detector, for
// tests that do less under it (processes of the test binary it slows
// down) or check less (the Go scheduler's order it shuffles on purpose).
package racebuild

// Enabled is true when the program (or test) is built with the race
// detector.
const Enabled = false
