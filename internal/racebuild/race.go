//go:build race

package racebuild

// Enabled is true when the program (or test) is built with the race
// detector.
const Enabled = true
